"""keras_vit against keras-hub and timm, each peer in its own process from its
own interpreter, in alternating rounds, at every setting each one has.

    bench/make_peer_venvs.sh VENVS          # once: VENVS/kerashub, VENVS/torch
    python bench/peers.py --venvs VENVS --variant Ti/16 --image-sizes 224 \
        --batch-sizes 32 --rounds 2 --json bench/results/peers.json

Settings: keras_vit and keras-hub at float32 / mixed bfloat16 x XLA off / on;
timm at float32 / bfloat16 autocast x eager / `torch.compile` (`--compile`).
`--remat` adds keras_vit's gradient checkpointing and timm's
`set_grad_checkpointing` to the training runs. Every (size, batch, mode,
peer, setting) is one fresh process per round (`bench/peer_worker.py`), so
one peer's allocator or threads never slow another, and the rounds alternate
so a load change hits all alike. The scaling table is the same script over
a grid: `--image-sizes 224,384,512 --batch-sizes 1,8,32 --remat`.

A peer whose interpreter is missing or cannot import it is skipped with one
line; the JSON records versions, CPU flags and the load average.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
PEERS = ("keras_vit", "keras_hub", "timm")
VENV_NAMES = {"keras_hub": "kerashub", "timm": "torch"}
IMPORTS = {"keras_vit": "tensorflow", "keras_hub": "keras_hub", "timm": "timm"}
CPU_FLAGS = ("avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "amx_bf16")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--venvs", default="", help="folder of make_peer_venvs.sh")
    parser.add_argument("--peers", default=",".join(PEERS))
    parser.add_argument("--modes", default="train,infer")
    parser.add_argument("--precisions", default="float32,bfloat16")
    parser.add_argument("--variant", default="Ti/16")
    parser.add_argument("--num-layers", type=int, default=0)
    parser.add_argument("--image-sizes", default="224")
    parser.add_argument("--batch-sizes", default="32")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--no-jit", action="store_true", help="skip XLA settings")
    parser.add_argument("--compile", action="store_true", help="add torch.compile")
    parser.add_argument("--remat", action="store_true", help="add checkpointing")
    parser.add_argument("--timeout", type=float, default=1800)
    parser.add_argument("--json", default="")
    args = parser.parse_args(argv)
    for flag, valid in (
        ("peers", PEERS),
        ("modes", ("train", "infer")),
        ("precisions", ("float32", "bfloat16")),
    ):
        values = [v for v in getattr(args, flag).split(",") if v]
        bad = [v for v in values if v not in valid]
        if bad or not values:
            parser.error(f"--{flag} {bad or values}: valid values are {list(valid)}")
        setattr(args, flag, values)
    for flag in ("image_sizes", "batch_sizes"):
        text = getattr(args, flag)
        try:
            values = [int(v) for v in text.split(",")]
        except ValueError:
            values = []
        if not values or min(values) < 1:
            parser.error(f"--{flag.replace('_', '-')} {text!r}: positive integers")
        setattr(args, flag, values)
    if args.rounds < 1 or args.steps < 1 or args.warmup < 1:
        parser.error("--rounds, --steps and --warmup must be >= 1")
    return args


def interpreter(peer: str, venvs: str) -> str | None:
    """The peer's Python, or None (with the reason printed) if it lacks it."""
    python = sys.executable
    if peer != "keras_vit":
        python = str(Path(venvs) / VENV_NAMES[peer] / "bin" / "python")
        if not venvs or not Path(python).exists():
            print(f"skip {peer}: no {python} (bench/make_peer_venvs.sh makes it)")
            return None
    probe = subprocess.run(
        [python, "-c", f"import {IMPORTS[peer]}"], capture_output=True, text=True
    )
    if probe.returncode:
        reason = (probe.stderr.strip().splitlines() or ["?"])[-1]
        print(f"skip {peer}: {python} cannot import {IMPORTS[peer]} ({reason})")
        return None
    return python


def settings(peer: str, mode: str, args) -> list[dict]:
    """Every setting of `peer` for `mode` that the flags ask for."""
    compiled = ((0, 1) if args.compile else (0,)) if peer == "timm" else (0,)
    jits = (0,) if peer == "timm" or args.no_jit else (0, 1)
    remats = (0, 1) if args.remat and mode == "train" and peer != "keras_hub" else (0,)
    # keras_vit's inference with its fused kernels (`fused.inference()`),
    # an opt-in like timm's torch.compile; not inside an XLA-compiled step.
    kernels = (0, 1) if peer == "keras_vit" and mode == "infer" else (0,)
    return [
        dict(precision=p, jit=j, compile=c, remat=r, kernels=k)
        for p, j, c, r, k in itertools.product(
            args.precisions, jits, compiled, remats, kernels
        )
        if not (j and k)
    ]


def label(setting: dict) -> str:
    parts = [setting["precision"]]
    parts += ["xla"] if setting["jit"] else []
    parts += ["compile"] if setting["compile"] else []
    parts += ["remat"] if setting["remat"] else []
    parts += ["kernels"] if setting.get("kernels") else []
    return " ".join(parts)


def run_one(python: str, peer: str, mode: str, size: int, batch: int, setting, args):
    command = [python, str(HERE / "peer_worker.py"), "--peer", peer, "--mode", mode]
    command += ["--variant", args.variant, "--num-layers", str(args.num_layers)]
    command += ["--image-size", str(size), "--batch-size", str(batch)]
    command += ["--steps", str(args.steps), "--warmup", str(args.warmup)]
    for key in ("precision", "jit", "compile", "remat", "kernels"):
        command += [f"--{key}", str(setting[key])]
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    try:
        proc = subprocess.run(
            command, capture_output=True, text=True, timeout=args.timeout, env=env
        )
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {args.timeout:.0f} s"}
    lines = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
    if proc.returncode or not lines:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return {"error": f"exit {proc.returncode}: {tail[-300:]}"}
    return json.loads(lines[-1][len("RESULT ") :])


def environment() -> dict:
    flags = set()
    name = platform.processor()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
            elif line.startswith("model name"):
                name = line.split(":", 1)[1].strip()
    except OSError:
        pass
    return {
        "cpu": name,
        "cpu_flags": [f for f in CPU_FLAGS if f in flags],
        "cpu_count": os.cpu_count(),
        "load_average_start": os.getloadavg(),
        "onednn_max_cpu_isa": os.environ.get("ONEDNN_MAX_CPU_ISA", "default"),
        # PyTorch's MKL matmuls read their own limit.
        "mkl_enable_instructions": os.environ.get("MKL_ENABLE_INSTRUCTIONS", "default"),
        "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def run(args) -> dict:
    started = environment()
    pythons = {p: interpreter(p, args.venvs) for p in args.peers}
    cases = [
        (size, batch, mode, peer, setting)
        for size in args.image_sizes
        for batch in args.batch_sizes
        for mode in args.modes
        for peer in args.peers
        if pythons[peer]
        for setting in settings(peer, mode, args)
    ]
    rounds = {i: [] for i in range(len(cases))}
    for round_index in range(args.rounds):
        # Alternate: each round runs every case once, the order reversed on
        # odd rounds so no case always runs first after a pause.
        order = range(len(cases))
        for i in order if round_index % 2 == 0 else reversed(order):
            size, batch, mode, peer, setting = cases[i]
            result = run_one(pythons[peer], peer, mode, size, batch, setting, args)
            rounds[i].append(result)
            shown = result.get("images_per_second", result.get("error"))
            print(
                f"round {round_index}: {size}px b{batch} {mode} {peer} "
                f"({label(setting)}): {shown}",
                flush=True,
            )
    results = []
    for i, (size, batch, mode, peer, setting) in enumerate(cases):
        ok = [r for r in rounds[i] if "images_per_second" in r]
        rates = [r["images_per_second"] for r in ok]
        results.append(
            {
                "image_size": size,
                "batch_size": batch,
                "mode": mode,
                "peer": peer,
                "setting": label(setting),
                **setting,
                "best_images_per_second": max(rates) if rates else None,
                "median_images_per_second": statistics.median(rates) if rates else None,
                "peak_rss_mib": max((r["peak_rss_mib"] or 0) for r in ok)
                if ok
                else None,
                # Peak minus the RSS with the model built (peer_worker.py).
                "step_memory_mib": max(r["step_memory_mib"] for r in ok)
                if ok
                else None,
                "errors": [r["error"] for r in rounds[i] if "error" in r],
                "versions": ok[0]["versions"] if ok else None,
            }
        )
    return {
        "variant": args.variant,
        "num_layers": args.num_layers or None,
        "rounds": args.rounds,
        "steps": args.steps,
        "environment": {**started, "load_average_end": os.getloadavg()},
        "results": results,
        "best": best_table(results),
    }


def best_table(results: list[dict]) -> list[dict]:
    """Per (size, batch, mode): each peer's best setting, and keras_vit's
    ratio to every other peer's best."""
    rows = []
    keys = sorted({(r["image_size"], r["batch_size"], r["mode"]) for r in results})
    for size, batch, mode in keys:
        row = {"image_size": size, "batch_size": batch, "mode": mode}
        for r in results:
            if (r["image_size"], r["batch_size"], r["mode"]) != (size, batch, mode):
                continue
            rate = r["best_images_per_second"]
            if rate and rate > row.get(r["peer"], (0,))[0]:
                row[r["peer"]] = (rate, r["setting"], r["peak_rss_mib"])
        ours = row.get("keras_vit")
        for peer in PEERS[1:]:
            if ours and peer in row:
                row[f"keras_vit/{peer}"] = ours[0] / row[peer][0]
        rows.append(row)
    return rows


def format_table(report: dict) -> str:
    lines = ["| size | batch | mode | peer | best img/s | setting | peak RSS MiB |"]
    lines.append("| ---: | ---: | --- | --- | ---: | --- | ---: |")
    for row in report["best"]:
        for peer in PEERS:
            if peer in row:
                rate, setting, rss = row[peer]
                lines.append(
                    f"| {row['image_size']} | {row['batch_size']} | {row['mode']} | "
                    f"{peer} | {rate:.2f} | {setting} | {rss or 0:.0f} |"
                )
        for peer in PEERS[1:]:
            ratio = row.get(f"keras_vit/{peer}")
            if ratio:
                lines.append(f"| | | | keras_vit / {peer} | {ratio:.2f}x | | |")
    env = report["environment"]
    lines.append(
        f"\n{env['cpu']}, {env['cpu_count']} CPUs, flags {' '.join(env['cpu_flags'])},"
        f" load {env['load_average_start'][0]:.1f} -> {env['load_average_end'][0]:.1f}"
    )
    return "\n".join(lines)


def main(argv=None) -> int:
    args = parse_args(argv)
    report = run(args)
    print(format_table(report))
    if args.json:
        path = Path(args.json)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_text(json.dumps(report, indent=2) + "\n")
        os.replace(tmp, path)  # never a half-written report
    return 0


if __name__ == "__main__":
    sys.exit(main())
