import numpy as np, keras, keras_vit, os
from keras_vit.layers.position_embedding import resample_position_embedding
B = keras.backend.backend()
kw = dict(patch_size=8, hidden_size=16, mlp_dim=32, num_heads=2, num_layers=1, num_classes=5)
rng = np.random.default_rng(1)
def rand(m):
    for v in m.weights: v.assign(rng.normal(0, 0.3, v.shape).astype("float32"))
# 1. one fixed side
m = keras_vit.ViT(None, input_shape=(32, None, 3), **kw); rand(m)
pe = keras.ops.convert_to_numpy(m.get_layer("posembed_input").pos_embedding)
print("fixed-side posemb shape", pe.shape, "image_size stored grid", m.get_layer("posembed_input").grid)
for w in [8, 32, 56]:
    x = rng.uniform(-1, 1, (2, 32, w, 3)).astype("float32")
    st = keras_vit.ViT(None, input_shape=(32, w, 3), **kw)
    for vs, vd in zip(st.weights, m.weights):
        vs.assign(resample_position_embedding(pe, (4, w // 8), source_grid=m.get_layer("posembed_input").grid) if "pos_emb" in vs.path else keras.ops.convert_to_numpy(vd))
    print(B, "fixed height, width", w, np.abs(keras.ops.convert_to_numpy(m(x)) - keras.ops.convert_to_numpy(st(x))).max(),
          np.abs(m.predict(x, verbose=0) - keras.ops.convert_to_numpy(st(x))).max())
try:
    m.predict(np.zeros((1, 40, 16, 3), "float32"), verbose=0); print("NO ERROR wrong fixed height")
except Exception as e: print("wrong height err", type(e).__name__, str(e).splitlines()[-1][:120] if str(e) else "")
# 2. .keras save/load of dynamic (non-square image_size) + export_npz roundtrip
d = keras_vit.ViT(None, input_shape=(None, None, 3), image_size=(32, 48), posemb_interpolation="bicubic", **kw); rand(d)
d.save("dyn.keras")
d2 = keras.models.load_model("dyn.keras")
for hw in [(32, 48), (16, 16), (64, 24)]:
    x = rng.uniform(-1, 1, (2, *hw, 3)).astype("float32")
    print(B, ".keras reload", hw, np.abs(keras.ops.convert_to_numpy(d(x)) - keras.ops.convert_to_numpy(d2(x))).max(), np.abs(d.predict(x, verbose=0) - d2.predict(x, verbose=0)).max())
keras_vit.export_npz(d, "dyn.npz")
z = np.load("dyn.npz"); print("npz keys posemb", [k for k in z.files if "posemb" in k], z["Transformer/posembed_input/pos_embedding"].shape, z.get("keras_vit/posemb_grid"))
# load into dynamic model with another stored size: resampled once
d3 = keras_vit.ViT(None, input_shape=(None, None, 3), image_size=(64, 64), posemb_interpolation="bicubic", weights="dyn.npz", **kw)
pe3 = keras.ops.convert_to_numpy(d3.get_layer("posembed_input").pos_embedding)
pe_d = keras.ops.convert_to_numpy(d.get_layer("posembed_input").pos_embedding)
print("reload at image_size 64:", np.abs(pe3 - resample_position_embedding(pe_d, (8, 8), source_grid=(4, 6), interpolation="bicubic")).max())
# and into a static model at 32x48
s = keras_vit.ViT(None, input_shape=(32, 48, 3), weights="dyn.npz", **kw)
x = rng.uniform(-1, 1, (2, 32, 48, 3)).astype("float32")
print("static 32x48 from dyn npz", np.abs(keras.ops.convert_to_numpy(s(x)) - keras.ops.convert_to_numpy(d(x))).max())
# 3. feature maps
fb = keras_vit.ViT(None, input_shape=(None, None, 3), include_top=False, **kw)
fm = keras_vit.feature_maps(fb)
for hw in [(16, 40), (8, 8)]:
    print(B, "feature_maps", hw, tuple(fm(np.zeros((2, *hw, 3), "float32")).shape), fm.predict(np.zeros((2, *hw, 3), "float32"), verbose=0).shape)
# 4. weights.h5 from a static model into a dynamic model
st = keras_vit.ViT(None, input_shape=(48, 48, 3), **kw); rand(st); st.save_weights("st48.weights.h5")
dd = keras_vit.ViT(None, input_shape=(None, None, 3), image_size=32, **kw)
try:
    dd.load_weights("st48.weights.h5")
    print("h5 static48 -> dyn32 posemb", np.abs(keras.ops.convert_to_numpy(dd.get_layer("posembed_input").pos_embedding) - resample_position_embedding(keras.ops.convert_to_numpy(st.get_layer("posembed_input").pos_embedding), (4, 4))).max())
except Exception as e: print("h5 static->dyn (model.load_weights) err", type(e).__name__, str(e)[:200])
try:
    keras_vit.load_weights(dd, "st48.weights.h5")
    print("keras_vit.load_weights h5 static48 -> dyn32 posemb", np.abs(keras.ops.convert_to_numpy(dd.get_layer("posembed_input").pos_embedding) - resample_position_embedding(keras.ops.convert_to_numpy(st.get_layer("posembed_input").pos_embedding), (4, 4))).max())
except Exception as e: print("keras_vit.load_weights h5 err", type(e).__name__, str(e)[:300])
