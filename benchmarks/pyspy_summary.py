"""Inclusive and self shares of functions in a py-spy raw profile, restricted to stacks through one function.

    py-spy record --nonblocking --format raw -o profile.txt -- python ...
    python benchmarks/pyspy_summary.py profile.txt timed_decode_loop [--top 45]
"""

import argparse
import collections


def frame_name(frame: str, keep_line: bool) -> str:
    """'function (path/file.py:line)' -> 'function (file.py)', with ':line' when `keep_line`."""
    if " (" not in frame:
        return frame
    function, location = frame.split(" (", 1)
    location = location.rstrip(")").split("/")[-1]
    return f"{function} ({location if keep_line else location.split(':')[0]})"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("profile")
    parser.add_argument("within", help="keep only stacks through a function of this name")
    parser.add_argument("--top", type=int, default=45)
    options = parser.parse_args()
    total, inclusive, own = 0, collections.Counter(), collections.Counter()
    with open(options.profile) as lines:
        for line in lines:
            stack, _, count = line.rstrip().rpartition(" ")
            if options.within not in stack:
                continue
            total += int(count)
            frames = stack.split(";")
            for name in {frame_name(frame, keep_line=False) for frame in frames}:
                inclusive[name] += int(count)
            own[frame_name(frames[-1], keep_line=True)] += int(count)
    print(f"samples: {total}")
    for name, count in inclusive.most_common(options.top):
        print(f"{100 * count / max(total, 1):5.1f}%  {name}")
    print("--- self")
    for name, count in own.most_common(options.top // 2):
        print(f"{100 * count / max(total, 1):5.1f}%  {name}")


if __name__ == "__main__":
    main()
