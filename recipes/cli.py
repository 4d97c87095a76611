"""One command-line dialect for every recipe.

`python -m recipes.<recipe> [--config=NAME] [--smoke] [--field=value ...]`:
the value of a field is, by increasing priority, its default, the named
config, the smoke settings, then the flag (`--field=value`, `--field
value`, dashes for underscores: `--learning-rate`). Types come from the
config dataclass: numbers, `true`/`false` (a bare `--flag` is true),
`none` for optional fields, comma-separated lists, JSON objects.

Nothing here imports Keras or TensorFlow: `--help` and bad flags answer at
once. Expected failures (a bad flag, a config mismatch, a missing dataset,
no TPU, ...) end in one line `error: ...` and exit status 2, no traceback.
"""

import argparse
import dataclasses
import json
import os
import re
import sys
import tempfile
import typing

from recipes.configs import OPTIMIZERS

NONE = ("none", "null", "")


class RecipeError(ValueError):
    """An expected failure: reported as one `error:` line, exit status 2."""


def parse_bool(text):
    if isinstance(text, bool):
        return text
    value = str(text).strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def _parse_json(text):
    if isinstance(text, dict):
        return dict(text)
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {text!r} ({e})") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {text!r}")
    return value


def parser_for(annotation):
    """`(parse function, metavar)` of a config field's type annotation."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Union and type(None) in args:
        (inner,) = [a for a in args if a is not type(None)]
        parse, metavar = parser_for(inner)

        def parse_optional(text):
            if text is None or str(text).strip().lower() in NONE:
                return None
            return parse(text)

        return parse_optional, metavar
    if origin is tuple:
        item = args[0]

        def parse_list(text):
            if isinstance(text, (list, tuple)):
                return tuple(item(t) for t in text)
            parts = [p for p in str(text).replace(" ", "").split(",") if p]
            if not parts:
                raise argparse.ArgumentTypeError(f"expected a comma-separated list, got {text!r}")
            try:
                return tuple(item(p) for p in parts)
            except ValueError:
                raise argparse.ArgumentTypeError(
                    f"expected comma-separated {item.__name__}s, got {text!r}"
                ) from None

        return parse_list, f"{item.__name__.upper()}S"
    if annotation is bool:
        return parse_bool, "BOOL"
    if annotation is dict:
        return _parse_json, "JSON"
    if annotation in (int, float, str):
        return annotation, annotation.__name__.upper()
    raise TypeError(f"Unsupported config field type {annotation!r}")


def show(value):
    """`value` as written on the command line (`--image_size=16,24`)."""
    if isinstance(value, (tuple, list)):
        return ",".join(str(v) for v in value)
    if isinstance(value, dict):
        return json.dumps(value)
    return "none" if value is None else str(value)


class _Parser(argparse.ArgumentParser):
    def __init__(self, **kwargs):
        # No abbreviations: `--conf=cifar100` would name the run cifar100 and
        # train the default config (`_prescan` sees whole flags only).
        super().__init__(allow_abbrev=False, **kwargs)

    def error(self, message):
        # One line, as every other expected failure.
        self.exit(2, f"error: {message} (see {self.prog} --help)\n")


def _prescan(argv, prog):
    """`--config` and `--smoke` before the full parser (they choose the
    defaults it shows). Only whole flags count: a value that happens to
    contain `--smoke` is not one."""
    name, smoke = None, False
    for i, token in enumerate(argv):
        if token == "--config" and i + 1 < len(argv):
            name = argv[i + 1]
        elif token.startswith("--config="):
            name = token.split("=", 1)[1]
        elif token == "--smoke" or token.startswith("--smoke="):
            # A value as argparse reads it: `--smoke=false`, `--smoke false`.
            value = token.split("=", 1)[1] if "=" in token else (
                argv[i + 1] if i + 1 < len(argv) and not argv[i + 1].startswith("-") else True)
            try:
                smoke = parse_bool(value)
            except argparse.ArgumentTypeError as e:
                _Parser(prog=prog).error(f"argument --smoke: {e}")
    return name, smoke


def parse(argv, recipe, *, prog, description):
    """Parses `argv` (None: `sys.argv[1:]`) into `(config_name, config,
    smoke)` for `recipe` (a `recipes.configs.Recipe`); `description` is the
    text of `--help`."""
    argv = list(sys.argv[1:] if argv is None else argv)
    name, smoke = _prescan(argv, prog)
    name = recipe.default if name is None else name
    if name not in recipe.configs:
        _Parser(prog=prog).error(f"unknown config; expected one of {sorted(recipe.configs)}. Received: config={name!r}")
    config = recipe.get_config(name, smoke=smoke)
    epilog = "Named configs (--config=NAME):\n" + "\n".join(
        f"  {n}: {named.summary}\n      expected: {named.expected}" for n, named in recipe.configs.items())
    parser = _Parser(prog=prog, description=description, epilog=epilog,
                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default=recipe.default, choices=sorted(recipe.configs),
                        help=f"named config (default: {recipe.default})")
    parser.add_argument("--smoke", nargs="?", const=True, default=False, type=parse_bool,
                        help="a tiny model for a few steps on generated data: checks the set-up, no download")
    types = type(config).types()
    fields = [f for f in dataclasses.fields(config) if f.name not in recipe.fixed]
    for field in fields:
        parse_value, metavar = parser_for(types[field.name])
        value = getattr(config, field.name)
        kwargs = dict(type=parse_value, default=value, metavar=metavar, dest=field.name)
        if metavar == "BOOL":
            kwargs.update(nargs="?", const=True)
        flags = [f"--{field.name}"] + ([f"--{field.name.replace('_', '-')}"] if "_" in field.name else [])
        valid = f", in {field.metadata['valid']}" if field.metadata.get("valid") else ""
        takes = field.metadata.get("library")
        shown, text = show(value), field.metadata.get("help", "")
        if takes and value is None:  # the optimizer function's default, or a field it does not use
            shown = (f"{OPTIMIZERS[config.optimizer]}'s" if config.optimizer in takes else
                     f"none; --optimizer={' or '.join(takes)} only")
        elif value in (None, ()) and text.endswith(")") and " (default: " in text:  # the help says what None means
            text, shown = text[:-1].split(" (default: ", 1)
        help_text = f"{text} (default: {shown}{valid})"
        parser.add_argument(*flags, help=help_text.replace("%", "%%"), **kwargs)  # argparse %-formats help
    args = parser.parse_args(argv)
    for field in fields:
        setattr(config, field.name, getattr(args, field.name))
    try:
        config.check()
    except ValueError as error:
        parser.error(str(error))
    return args.config, config, bool(args.smoke)


def entry_points(recipe, run, *, prog, description):
    """A recipe's `parse(argv=None)` -> `(config_name, config, smoke)` and
    `main(argv=None, **kwargs)`, which parses and returns `run(config,
    config_name, smoke=smoke, **kwargs)` (e.g. `callbacks=`)."""

    def parse_argv(argv=None):
        return parse(argv, recipe, prog=prog, description=description)

    def main(argv=None, **kwargs):
        config_name, config, smoke = parse_argv(argv)
        import_tensorflow_quietly()
        return run(config, config_name, smoke=smoke, **kwargs)

    return parse_argv, main


def one_line(error, details=3):
    """A message on one line: a multi-line message (e.g. the weight loader's
    list of mismatches) keeps its first `details` lines after the first."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    if len(lines) <= details + 1:
        return "; ".join(lines)
    return "; ".join(lines[: details + 1]) + f"; ... ({len(lines) - details - 1} more lines)"


# What TensorFlow's native libraries print to stderr as they load, whatever
# TF_CPP_MIN_LOG_LEVEL says: absl's notice that it logs before being
# initialised, and INFO lines in absl's format (`I0000 00:00:1764028026.123456
# 42 port.cc:153] oneDNN custom operations are on. ...`, twice per process on
# CPUs with AMX or AVX512-BF16; before initialisation the time is in seconds).
# Warnings (W...) and errors (E..., F...) are kept.
_TENSORFLOW_STARTUP_LINE = re.compile(
    r"WARNING: All log messages before absl::InitializeLog\(\) is called"
    r"|I\d{4} \d\d:\d\d:\d+\.\d+ +\d+ [^\]\s]+:\d+\] "
)


def import_tensorflow_quietly():
    """Imports TensorFlow (the recipes' input pipelines need it) with its
    native start-up information lines left out of stderr, so that a recipe's
    expected failure is one line on every CPU.

    The native libraries write to file descriptor 2 directly, so it is
    pointed at a temporary file during the import; everything else written
    there (Python warnings, native warnings and errors) is written back to
    stderr afterwards, in order. Nothing changes numerically (oneDNN stays as
    TensorFlow chose). A no-op once TensorFlow is imported; if it is not
    installed, the later import that needs it reports that.
    """
    if "tensorflow" in sys.modules:
        return
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), 2)
        try:
            import tensorflow  # noqa: F401
        except ImportError:
            pass
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            captured.seek(0)
            text = captured.read().decode("utf-8", errors="replace")
    kept = [line for line in text.splitlines(keepends=True) if not _TENSORFLOW_STARTUP_LINE.match(line)]
    sys.stderr.write("".join(kept))
    sys.stderr.flush()


def run_command(main):
    """Runs a recipe's `main()` as a command: an expected failure prints one
    `error:` line and exits with status 2.

    TensorFlow's C++ information lines (CPU features, ... printed when it
    loads) are left out unless `TF_CPP_MIN_LOG_LEVEL` is set, and the lines
    that ignore it are filtered (`import_tensorflow_quietly`), so that an
    expected failure is the one line on stderr; warnings and errors stay.
    """
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
    try:
        return main()
    except RecipeError as error:
        sys.stderr.write(f"error: {one_line(error)}\n")
        sys.exit(2)
    except KeyboardInterrupt:
        sys.stderr.write("interrupted: the same command resumes from the last checkpoint\n")
        sys.exit(130)
