import numpy as np, torch, scipy.ndimage as nd
from keras_vit.layers.position_embedding import resample_grid
rng = np.random.default_rng(0)
worst = {}
for (r, c) in [(4, 4), (3, 5), (7, 7), (14, 14)]:
    g = rng.normal(size=(r, c, 6))
    for (R, C) in [(1, 1), (1, 5), (2, 2), (5, 3), (8, 8), (24, 24), (2, 9), (r, c), (6, 1)]:
        lin = resample_grid(g, (R, C), "linear")
        # scipy zoom with explicit output shape as original
        z = nd.zoom(g, (R / r, C / c, 1), order=1)
        if z.shape[:2] != (R, C):
            z = None
        t = torch.tensor(g).permute(2, 0, 1)[None]
        bic = torch.nn.functional.interpolate(t, size=(R, C), mode="bicubic", align_corners=False)[0].permute(1, 2, 0).numpy()
        bia = torch.nn.functional.interpolate(t.float(), size=(R, C), mode="bicubic", align_corners=False, antialias=True)[0].permute(1, 2, 0).numpy()
        d1 = None if z is None else np.abs(lin - z).max()
        d2 = np.abs(resample_grid(g, (R, C), "bicubic") - bic).max()
        d3 = np.abs(resample_grid(g, (R, C), "bicubic_antialias") - bia).max()
        print((r, c), "->", (R, C), "linear-vs-zoom", d1, "bicubic", f"{d2:.1e}", "antialias", f"{d3:.1e}")
