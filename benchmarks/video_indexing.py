"""Video indexing throughput: scene detection and frame sampling on the shared videos, as multiples of real time.

Usage (CPU): `python benchmarks/video_indexing.py [--videos DIR] [--width 256] [--frames 8]`

For every video it times, in one process and side by side:
- scene detection (PySceneDetect ContentDetector on PyAV-decoded frames scaled to `--width`), decoding every frame;
- the same with non-reference frames skipped by the decoder (`skip_nonref`, the clip KB option);
- frame sampling: `--frames` frames per detected clip (seek + decode forward), as the clip KB does;
and prints seconds of video processed per wall-clock second (x real time; target >= 20x on 2 cores) and the
process's peak resident memory. The machine's load average is printed too: on a shared machine it matters.
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

DEFAULT_VIDEOS = Path(__file__).resolve().parents[2] / "shared" / "data" / "video" / "videos"


def peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--videos", type=Path, default=DEFAULT_VIDEOS, help="folder of videos")
    parser.add_argument("--width", type=int, default=256, help="detection width in pixels")
    parser.add_argument("--frames", type=int, default=8, help="frames sampled per clip")
    args = parser.parse_args(argv)
    from retrievers.media import frames_at, probe_video, uniform_times
    from retrievers.video import detect_cuts, scenes_to_clips

    videos = sorted(p for p in args.videos.iterdir() if p.suffix in (".mp4", ".mkv", ".webm"))
    if not videos:
        print(f"no videos in {args.videos}")
        return 1
    print(
        f"cpus: {os.cpu_count()}  load average before: {' '.join(f'{x:.1f}' for x in os.getloadavg())}  "
        f"detection width: {args.width}  frames/clip: {args.frames}"
    )
    print("each cell: x real time on the wall clock / per CPU-second of this process (user+sys, all threads)")
    stages = ("detect", "detect nonref", "sample", "sample nonref")
    header = f"{'video':28} {'codec':5} {'dur s':>5} {'cuts':>4} " + " ".join(f"{s:>15}" for s in stages)
    header += f" {'peak MiB':>8}"
    print(header)
    print("-" * len(header))
    total = {s: [0.0, 0.0] for s in stages}
    total_dur = 0.0

    def timed(fn, *fn_args, **kwargs):
        w0, c0 = time.perf_counter(), time.process_time()
        result = fn(*fn_args, **kwargs)
        return result, time.perf_counter() - w0, time.process_time() - c0

    for path in videos:
        info = probe_video(path)
        cuts, *t_detect = timed(detect_cuts, path, width=args.width)
        _, *t_nonref = timed(detect_cuts, path, width=args.width, skip_nonref=True)
        clips = scenes_to_clips(cuts.seconds, cuts.duration, 2.0, 180.0)
        times = [t for a, b in clips for t in uniform_times(a, b, args.frames)]
        _, *t_sample = timed(frames_at, path, times, max_side=336)
        _, *t_sample_nr = timed(frames_at, path, times, max_side=336, skip_nonref=True)
        d = cuts.duration
        total_dur += d
        cells = []
        for stage, (wall, cpu) in zip(stages, (t_detect, t_nonref, t_sample, t_sample_nr), strict=True):
            total[stage][0] += wall
            total[stage][1] += cpu
            cells.append(f"{d / wall:6.1f} / {d / cpu:6.1f}")
        print(
            f"{path.name[:28]:28} {info.codec:5} {d:5.1f} {len(cuts.frames):4d} "
            + " ".join(f"{c:>15}" for c in cells)
            + f" {peak_mib():8.0f}"
        )
    print("-" * len(header))
    cells = [f"{total_dur / w:6.1f} / {total_dur / c:6.1f}" for w, c in total.values()]
    print(f"{'all':28} {'':5} {total_dur:5.1f} {'':4} " + " ".join(f"{c:>15}" for c in cells) + f" {peak_mib():8.0f}")
    print(
        f"load average after: {' '.join(f'{x:.1f}' for x in os.getloadavg())}. On an otherwise idle 2-core machine "
        "the wall-clock figure approaches the per-CPU-second figure times the decoder's parallelism (<= 2)."
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
