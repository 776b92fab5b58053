"""Cost of reading videos to the video budget (suzak.media.video.read_clip): PyAV decoding, frame sampling and fitting.

    python bench/bench_video_decode.py                       # 10 s clips at 640x360, 30 fps; 16 frames at 2 fps
    python bench/bench_video_decode.py --seconds 60 --clips 4
    python bench/bench_video_decode.py --table bench/results_video_decode.jsonl

Writes clips with PyAV (MPEG-4 part 2, the encoder every PyAV wheel has) into a temporary folder, untimed; then
times ``read_clip`` on each: one decoding pass over the file, RGB pictures of the sampled frames only, each fitted
to the budget. Also times the same clip given as decoded frames (a ``video`` column of images). One JSON line per
source goes to --results; the table sets the cost beside one GRPO step's share of a prompt on an H100
(docs/benchmarks.md), since a batch reads each distinct clip once.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
H100_S_PER_PROMPT = 13.3  # docs/benchmarks.md: 3B, 8 completions x 256 tokens per step, one H100 (HF generation)
FIELDS = ("source", "width", "height", "seconds", "fps", "frames_read", "tokens", "ms_per_clip", "share_of_h100_prompt",
          "cpus", "date")  # fmt: skip


def write_clip(path: Path, width: int, height: int, seconds: float, fps: int, seed: int) -> None:
    """A moving gradient with noise (so the encoder has real work), MPEG-4 at ``fps``."""
    import av
    import numpy as np

    rng = np.random.default_rng(seed)
    base = np.linspace(0, 255, width, dtype=np.float32)[None, :, None]
    with av.open(str(path), "w") as container:
        stream = container.add_stream("mpeg4", rate=fps)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        for i in range(int(seconds * fps)):
            frame = np.roll(base, 4 * i, axis=1) + rng.normal(0, 8, (height, width, 3))
            picture = np.clip(np.broadcast_to(frame, (height, width, 3)), 0, 255).astype(np.uint8)
            for packet in stream.encode(av.VideoFrame.from_ndarray(picture, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)


def measure(args) -> list[dict]:
    from transformers import AutoConfig

    from suzak.media.video import VideoBudget, decode_file, read_clip

    budget = VideoBudget(fps=args.sample_fps, max_frames=args.max_frames, max_pixels=args.max_pixels).for_model(
        AutoConfig.for_model("qwen2_5_vl"))  # fmt: skip
    rows = []
    with tempfile.TemporaryDirectory(prefix="suzak-bench-video-") as tmp:
        paths = [Path(tmp) / f"clip{i}.mp4" for i in range(args.clips)]
        for i, path in enumerate(paths):
            write_clip(path, args.width, args.height, args.seconds, args.fps, seed=i)
        frames_of = {paths[0]: decode_file(paths[0])[0]}  # every frame of one clip, as a video column holds them
        for source in ("mp4", "frames"):
            times, clip = [], None
            for path in paths if source == "mp4" else paths[:1] * args.clips:
                start = time.perf_counter()
                clip = read_clip(str(path) if source == "mp4" else frames_of[path], budget, fps=args.fps)
                times.append(time.perf_counter() - start)
            count, height, width, _ = clip.frames.shape
            ms = 1000 * statistics.median(times)
            rows.append({"source": source, "width": args.width, "height": args.height, "seconds": args.seconds,
                         "fps": args.fps, "frames_read": count, "tokens": budget.tokens(count, args.height, args.width),
                         "ms_per_clip": round(ms, 1), "share_of_h100_prompt": round(ms / 1000 / H100_S_PER_PROMPT, 5),
                         "cpus": os.cpu_count(), "date": datetime.date.today().isoformat()})  # fmt: skip
    return rows


def table(rows: list[dict]) -> str:
    lines = ["| source | video | frames read | video tokens | ms per clip | share of one H100 prompt | date |",
             "|---|---|---:|---:|---:|---:|---|"]  # fmt: skip
    for r in rows:
        video = f"{r['seconds']:g} s {r['width']}x{r['height']} at {r['fps']} fps"
        lines.append(f"| {r['source']} | {video} | {r['frames_read']} | {r['tokens']} | {r['ms_per_clip']} | "
                     f"{r['share_of_h100_prompt']:.2%} | {r['date']} |")  # fmt: skip
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--width", type=int, default=640)
    parser.add_argument("--height", type=int, default=360)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--fps", type=int, default=30)
    parser.add_argument("--clips", type=int, default=8)
    parser.add_argument("--sample_fps", type=float, default=2.0, help="the video budget's fps")
    parser.add_argument("--max_frames", type=int, default=16)
    parser.add_argument("--max_pixels", type=int, default=100352, help="per frame (128 tokens of 28x28 per 2 frames)")
    parser.add_argument("--results", default=str(ROOT / "bench" / "results_video_decode.jsonl"))
    parser.add_argument("--table", default=None, help="print the table of this results file and exit")
    args = parser.parse_args()
    if args.table:
        print(table([json.loads(line) for line in Path(args.table).read_text().splitlines() if line.strip()]))
        return
    rows = measure(args)
    with open(args.results, "a") as handle:
        for row in rows:
            handle.write(json.dumps({k: row[k] for k in FIELDS}) + "\n")
    print(table(rows))


if __name__ == "__main__":
    main()
