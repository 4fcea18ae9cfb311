"""Prints how fast this host runs now: the wall milliseconds of a fixed single-threaded loop,
the best of three (lower is faster). A busy or throttled host shows here and not in its load
average. Comparable between runs on one machine only. Used by the bench-*.sh scripts."""
import time


def once():
    started = time.perf_counter()
    sum(range(2_000_000))
    return time.perf_counter() - started


print("%.1f" % (min(once() for _ in range(3)) * 1000))
