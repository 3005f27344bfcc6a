"""The `init` and `convert` commands: seeded weights of a preset, and a checkpoint in another format."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

import reference_numpy as rn
from transformer_parity.config_fields import parse_fields
from transformer_parity.errors import UsageError
from transformer_parity.io.limits import check_streaming, parse_size
from transformer_parity.io.safe_text import printable
from transformer_parity.streaming.lazy import is_lazy

from .common import (FORMAT_CHOICES, BytesProgress, Formatter, add_allow_drop, add_config_options, input_format,
                     make_console, print_note)


INIT_EXAMPLES = """\
examples:
  transformer-parity init -o base.safetensors                     # the paper's base model, seeded
  transformer-parity init --preset tiny --seed 3 -o tiny.pt        # straight to a PyTorch file
  transformer-parity init --preset base --set num_heads=16 --set layer_norm_eps=1e-6 -o custom.safetensors
  transformer-parity init --config my_config.json -o mine.weights.h5
  transformer-parity init --exercise-all -o base.safetensors       # non-zero biases, non-unit gammas too
"""


def cmd_init(args) -> int:
    import numpy as np

    import reference_numpy as rn

    from transformer_parity import formats
    from transformer_parity.verify import seeded_weights

    fields = parse_fields(args.config, args.sets)
    out_format = formats.output_format(args.output, args.to)
    formats.check_destination(args.output, out_format, args.force)  # a file, or a model directory (--to hf)
    if args.seed < 0:
        raise UsageError(f"--seed must be >= 0, received {args.seed}")
    try:
        config = rn.TransformerConfig.preset(args.preset, **fields)
    except (TypeError, ValueError) as exc:
        raise UsageError(f"invalid config: {exc}") from None
    start = time.perf_counter()
    dtype = np.dtype(args.dtype)
    from transformer_parity.io import limits
    limits.check_memory(2 * dtype.itemsize * limits.parameter_count(config),  # each tensor drawn in float64, cast
                        f"init --preset {args.preset}" + "".join(f" --set {s}" for s in args.sets))
    weights = seeded_weights(config, args.seed, dtype) if args.exercise_all else rn.init_weights(config, args.seed,
                                                                                                    dtype)
    total = sum(w.nbytes for w in weights.values())
    size_text = _size(weights)
    notes: list[str] = []
    with BytesProgress(args, f"writing {printable(Path(args.output).name)}", total) as bar:
        path, fmt = formats.save(args.output, config, weights, out_format, args.force, bar.advance, consume=True,
                                 notes=notes)
    for note in notes:
        print_note(args, note)
    if not args.quiet:
        make_console(args).print(f"wrote {printable(path)} ({fmt}, {args.preset} preset, {size_text}) in "
                             f"{time.perf_counter() - start:.1f} s", markup=False)
    return 0


def _size(weights) -> str:
    n = sum(int(v.size) for v in weights.values())
    nbytes = sum(int(v.nbytes) for v in weights.values())
    from transformer_parity.io.limits import human_bytes

    return f"{n / 1e6:.1f} M parameters, {human_bytes(nbytes)}"


# --- convert ---------------------------------------------------------------------------------------------------------

CONVERT_EXAMPLES = """\
examples:
  transformer-parity convert base.safetensors base.pt                 # canonical -> PyTorch
  transformer-parity convert base.pt base.weights.h5                   # PyTorch -> Keras weights
  transformer-parity convert base.weights.h5 back.safetensors --force  # overwrite an existing file
  # a model built around torch.nn.Transformer (e.g. PyTorch's translation tutorial): what its weights cannot tell
  # (num_heads, activation, norm_first, layer_norm_eps, scale_embedding, pad_id) given in a JSON file:
  transformer-parity convert translator.pt translator.safetensors --from nn-transformer --config tutorial.json
  # canonical -> the tutorial's own state-dict layout (loads with model.load_state_dict):
  transformer-parity convert model.safetensors tutorial.pt --to nn-transformer
  # a Hugging Face model directory (save_pretrained's config.json + weights) to Keras, and back:
  transformer-parity convert model-dir model.weights.h5
  transformer-parity convert model.weights.h5 model-again --to hf
  # where KerasHub's class computes a nearby function (the tanh GELU for the source's exact one, q/k norms at an
  # epsilon of its own), convert refuses and says by how much the outputs differ on this model;
  # name the approximation to write it anyway (recorded in the preset's metadata.json; --to hf restores it):
  transformer-parity convert model-dir preset-dir --to kerashub --accept-approximation gelu_tanh
"""


def _convert_examples() -> str:
    """CONVERT_EXAMPLES and the formats, the families named as the registry (`layouts`) lists them."""
    import textwrap

    from transformer_parity.layouts import HF_LAYOUTS, KERASHUB_LAYOUTS

    family_names = (f"formats: canonical (.safetensors), torch (.pt/.pth), nn-transformer (.pt/.pth/.bin, a "
                    f"torch.nn.Transformer model's state dict), keras (.weights.h5), hf (a Hugging Face model "
                    f"directory; {', '.join(HF_LAYOUTS)} name its family), kerashub (a KerasHub preset directory or "
                    f"bare .weights.h5; {', '.join(KERASHUB_LAYOUTS)} name its family). Inferred from content and "
                    "extension; --from/--to override.")
    return CONVERT_EXAMPLES + "\n" + textwrap.fill(family_names, 116, break_on_hyphens=False) + "\n"


# Where a checkpoint's bfloat16 / float16 is kept as it is (a KerasHub preset as KerasHub's own bfloat16 presets, a
# Keras .weights.h5 as Keras stores a bfloat16 variable); the PyTorch pickle writers take float32 or float64.
KEEPS_HALF = ("canonical", "keras")  # and every Hugging Face directory and KerasHub preset
CAST = {"float32": np.float32, "float64": np.float64, "float16": np.float16, "bfloat16": "bfloat16"}


def _cast(loaded, dtype: str | None, out_format: str, notes: list[str]) -> None:
    """Cast the weights to --dtype as they are written; without it keep their dtype, unless the output format cannot
    hold half precision (then float32, exactly, and a note)."""
    from transformer_parity.formats import writes_directory
    from transformer_parity.io.safetensors_io import bfloat16

    current = rn.weights_dtype(loaded.weights)
    keeps = out_format in KEEPS_HALF or writes_directory(out_format)
    if dtype in ("bfloat16", "float16") and not keeps:
        raise UsageError(f"--dtype {dtype}: {out_format} is written in float32 or float64 here; {dtype} is kept in "
                         "canonical .safetensors, Keras .weights.h5, Hugging Face directories and KerasHub presets")
    if dtype is None:
        if current.itemsize >= 4 or keeps:
            return
        dtype = "float32"
        notes.append(f"written as float32 (exactly): {out_format} is written in float32 or float64 here, the "
                     f"checkpoint is {current}")
    target = bfloat16() if dtype == "bfloat16" else np.dtype(CAST[dtype])
    if target == current:
        return
    for name, value in loaded.weights.items():
        loaded.weights[name] = (value.astype(target) if is_lazy(value)
                                else np.asarray(value).astype(target))


def cmd_convert(args) -> int:
    from transformer_parity import formats
    from transformer_parity.io import outputs

    fields = parse_fields(args.config, args.sets)
    in_path = formats.check_source(args.input)
    out_format = formats.output_format(args.output, args.to)
    outputs.check_apart(in_path, args.output)  # before anything is read or moved
    out_path = formats.check_destination(args.output, out_format, args.force)
    to_layout = None
    if getattr(args, "to_layout", None):  # parsed (names checked as the output's keys) before the input is read
        from transformer_parity.layouts import user
        to_layout = user.load_for_writing(args.to_layout, out_path)
    start = time.perf_counter()
    size = formats.source_size(in_path)
    notes: list[str] = []
    max_shard = parse_size(args.max_shard_size) if args.max_shard_size else None
    with BytesProgress(args, f"reading {printable(in_path.name)}", size) as bar:
        reading = [True]  # a streamed input is read while the output is written: the bar then counts the writes
        from transformer_parity.layouts.probe import load_settled

        loaded, _ = load_settled(lambda given: formats.load(in_path, input_format(args), given,
                                                            lambda name, n: reading[0] and bar.advance(name, n),
                                                            allow_drop=args.allow_drop, lazy=True),
                                 in_path, fields, args.source, notes)
        reading[0] = False
        streamed = any(is_lazy(v) for v in loaded.weights.values())
        _cast(loaded, args.dtype, out_format if to_layout is None else "layout", notes)
        out_format = _kept_family(loaded, out_format, notes)
        record = _approximations(args, loaded, out_format if to_layout is None else "layout", notes)
        size_text = _size(loaded.weights)
        if streamed:
            check_streaming(loaded.weights)
        bar.describe(f"{'converting' if streamed else 'writing'} {printable(out_path.name)}", loaded.nbytes)
        on_written = bar.advance
        if to_layout is not None:
            path, fmt = out_path, user.export_with_layout(out_path, loaded.config, loaded.weights, to_layout,
                                                          args.force)
        else:
            path, fmt = formats.save(out_path, loaded.config, loaded.weights, out_format, args.force, on_written,
                                     consume=True, notes=notes, max_shard_size=max_shard, record=record,
                                     origin=loaded.origin)
    for note in loaded.notes + notes:
        print_note(args, note)
    if not args.quiet:
        make_console(args).print(f"converted {printable(in_path)} ({loaded.format}) -> {printable(path)} ({fmt}), "
                             f"{size_text}, in {time.perf_counter() - start:.1f} s", markup=False)
    return 0


def _kept_family(loaded, out_format: str, notes: list[str]) -> str:
    """`--to hf` / `--to kerashub` name no family: the one the weights came from (`Loaded.origin`, kept in canonical,
    Keras and .pt files), or its namesake in the other library, where it expresses the model; else the first that
    does, as before. A family goes HF -> Keras -> HF as itself, not as another that computes the same function."""
    from transformer_parity.layouts import HF_LAYOUTS, KERASHUB_LAYOUTS, hf
    from transformer_parity.layouts import kerashub_preset as kh

    worlds = {"hf": (HF_LAYOUTS, "hf-", hf.family_for_export), "kerashub": (KERASHUB_LAYOUTS, "kerashub-",
                                                                            kh.family_for_export)}
    if out_format not in worlds or loaded.origin is None:
        return out_format
    names, prefix, exporter = worlds[out_format]
    candidate = prefix + loaded.origin.split("-", 1)[1]
    if candidate not in names:
        return out_format
    try:
        exporter(loaded.config, candidate)
    except ValueError:
        return out_format  # it does not express this model (any more): the first family that does
    if candidate != loaded.format:
        notes.append(f"written as {candidate}: the weights came from {loaded.origin}")
    return candidate


def _approximations(args, loaded, out_format: str, notes: list[str]):
    """--accept-approximation (`layouts.approximations`): the `Record` to write with a KerasHub preset, `loaded.config`
    set to what the target computes; a refusal (exit 2) that names each approximation the export needs and the gap
    measured on this model when one is not accepted, or when a name is unknown or not needed. A preset that records
    approximations gives its source's settings back to a Hugging Face export and its record to a KerasHub one."""
    from transformer_parity.formats import is_directory_family
    from transformer_parity.layouts import hf
    from transformer_parity.layouts import kerashub_preset as kh

    accepted = list(dict.fromkeys(args.accept_approximation or ()))
    known = sorted(set(kh.known_approximations() + hf.known_approximations())) if accepted else []
    unknown = [name for name in accepted if name not in known]
    if unknown:
        raise UsageError(f"--accept-approximation {printable(unknown[0])!r} is not an approximation this tool knows; "
                         f"known: {', '.join(known)}")
    to_hf, to_kerashub = is_directory_family(out_format, "hf"), is_directory_family(out_format, "kerashub")
    held = kh.read_record(loaded.path) if is_directory_family(loaded.format, "kerashub") else None
    if held is not None and held.holds(loaded.config, "target") and (to_hf or to_kerashub):
        if accepted:  # the record settles it: the source's settings restored, or the record carried on
            raise UsageError(f"--accept-approximation {accepted[0]}: this preset records its accepted approximation(s) "
                             f"{', '.join(held.names)}; writing it as {out_format} needs no other")
        return _held(held, loaded, to_hf, notes)
    plan = kh.export_plan(loaded.config, out_format) if to_kerashub else \
        hf.export_plan(loaded.config, out_format) if to_hf else None
    if plan is None:
        if accepted:
            if to_kerashub:
                kh.family_for_export(loaded.config, out_format)  # a structural refusal says itself
            elif to_hf:
                hf.family_for_export(loaded.config, out_format)
            raise UsageError(f"--accept-approximation {accepted[0]}: this model needs no approximation to be written "
                             f"as {out_format}")
        return None
    extra = [name for name in accepted if name not in plan.names]
    if extra:
        raise UsageError(f"--accept-approximation {extra[0]}: this model does not need it to be written as "
                         f"{plan.family.name} (it needs {', '.join(plan.names)})")
    gap = _measure(loaded.config, plan, loaded.weights)
    if len(accepted) < len(plan.names):
        flags = " ".join(f"--accept-approximation {name}" for name in plan.names)
        raise UsageError(f"this model has no exact {plan.family.name} equivalent: {'; '.join(plan.says)}; on this "
                         f"model {gap.phrase()}; pass {flags} to write it anyway")
    from transformer_parity.layouts.approximations import Record

    notes.append(f"written as {plan.family.name} with the accepted approximation(s) {'; '.join(plan.says)}; on this "
                 f"model {gap.phrase()}; recorded in its "
                 f"{'config.json' if to_hf else 'metadata.json'}")
    loaded.config = plan.config
    return Record(plan.names, list(plan.says), plan.source_settings, plan.target_settings, gap.to_json())


def _held(record, loaded, to_hf: bool, notes: list[str]):
    """A preset's record of accepted approximations (which its config still computes) on the way out: a Hugging
    Face export computes the source's settings again (`Record.restore`), a KerasHub one carries the record on; None:
    nothing to write."""
    if to_hf:
        from transformer_parity.layouts.approximations import settings_text

        loaded.config = record.restore(loaded.config)
        settings = settings_text(record.source_settings, loaded.config)
        notes.append(f"restored the source's {settings} from the preset's record of the accepted approximation(s) "
                     f"{', '.join(record.names)} (the preset computes the approximation)")
        return None
    return record


def _measure(source, plan, weights):
    """The gap between the source's config and the one `plan` writes, on verify's probe batch
    (`verify.approximation.measure`)."""
    from transformer_parity.verify import DEFAULT_SHAPE, default_lengths
    from transformer_parity.verify.approximation import measure

    src_len, tgt_len = default_lengths(source, None, None, [])
    return measure(source, plan.config, weights, DEFAULT_SHAPE["batch"], src_len, tgt_len, seed=0,
                   needed=plan.needed)


def register(sub) -> None:
    p = sub.add_parser("init", help="write a seeded model of a preset or config", epilog=INIT_EXAMPLES,
                       formatter_class=Formatter, description="Write seeded weights for a preset or config.")
    p.add_argument("--preset", choices=("tiny", "base", "big"), default="base",
                   help="starting config (default: base, the paper's)")
    add_config_options(p)
    p.add_argument("--seed", type=int, default=0, help="weight seed (default 0)")
    p.add_argument("--dtype", choices=("float32", "float64"), default="float32", help="weight dtype")
    p.add_argument("--exercise-all", action="store_true",
                   help="draw biases and LayerNorm parameters at random too (better for verification)")
    p.add_argument("--to", choices=FORMAT_CHOICES, help="output format (default: from the extension)")
    p.add_argument("-o", "--output", required=True, metavar="PATH", help="file to write")
    p.add_argument("--force", action="store_true", help="overwrite PATH if it exists")
    p.set_defaults(func=cmd_init)

    p = sub.add_parser("convert", help="convert a checkpoint to another format", epilog=_convert_examples(),
                       formatter_class=Formatter,
                       description="Read a checkpoint in any supported format and write it in another, atomically\n"
                                   "(a temporary file renamed into place; nothing is left behind on error or Ctrl-C).")
    p.add_argument("input", metavar="IN", help="checkpoint to read (a file, or a Hugging Face model directory)")
    p.add_argument("output", metavar="OUT", help="file to write (a directory with --to hf)")
    p.add_argument("--from", dest="from_", choices=FORMAT_CHOICES, help="input format (default: inferred)")
    p.add_argument("--to", choices=FORMAT_CHOICES, help="output format (default: from OUT's extension)")
    p.add_argument("--layout", metavar="FILE.toml", help="a layout file describing IN, a model this tool does not "
                   "know (docs/layouts.md)")
    p.add_argument("--to-layout", metavar="FILE.toml", help="write OUT under the names of a layout file, for your own "
                   "model's load_state_dict / load_weights (.pt, .safetensors or .weights.h5)")
    p.add_argument("--source", metavar="FILE.py:NAME", help="the model's own code (verify's source contract): "
                   "settings IN does not tell are settled by probing it, each listed with its error")
    add_config_options(p)
    add_allow_drop(p)
    p.add_argument("--dtype", choices=tuple(CAST), help="write the weights in this dtype (default: as stored; "
                   "bfloat16 and float16 are kept in .safetensors, Keras .weights.h5, Hugging Face directories and "
                   "KerasHub presets)")
    p.add_argument("--max-shard-size", metavar="SIZE", help="split a Hugging Face directory's weights into shards "
                   "of at most SIZE (e.g. 2GB, 500MB; default 5GB), with model.safetensors.index.json")
    p.add_argument("--accept-approximation", action="append", metavar="NAME",
                   help="write a KerasHub preset whose class computes a nearby function where the model's differs "
                        "(gelu_tanh, head_norm_eps, qk_norm_eps; repeatable): without it such an export is refused "
                        "with the gap measured on this model; the preset records it (docs/kerashub.md, "
                        "'Approximations')")
    p.add_argument("--force", action="store_true", help="overwrite OUT if it exists")
    p.set_defaults(func=cmd_convert)
