"""The soak's result, its printed report and its one-line verdict."""

from __future__ import annotations

import argparse
from collections import Counter
from dataclasses import dataclass

from scripts.soak.client import Tally, count

KV_FREE, KV_TOTAL = "mm_infer_kv_blocks_free", "mm_infer_kv_blocks_total"
RSS_LIMIT_PCT = 5.0


@dataclass
class Result:
    tally: Tally
    rss: tuple[int, int]  # server tree KiB after warm-up, at the end (the server, its engine core, template workers)
    own_rss: tuple[int, int]  # the same, the server process alone
    rss_samples: list[int]  # KiB, every RSS_PERIOD_S seconds of the measured run
    warm_peak: int  # KiB, the highest sample of the warm-up
    metrics: dict[str, float]
    control: list[str]
    elapsed: float
    roles: tuple[dict[str, int], dict[str, int]] = ({}, {})  # KiB per process role, after warm-up and at the end

    @property
    def growth_pct(self) -> float:
        return 100.0 * (self.rss[1] - self.rss[0]) / self.rss[0]

    @property
    def own_growth_pct(self) -> float:
        return 100.0 * (self.own_rss[1] - self.own_rss[0]) / self.own_rss[0]

    @property
    def peak(self) -> int:
        return max([*self.rss_samples, *self.rss])


def _mib(kib: int) -> str:
    return f"{kib / 1024:.1f}"


def _role_growth(res: Result) -> dict[str, float]:
    """Growth (%) of the server process and of the engine core over the measured run."""
    start, end = res.roles
    return {role: 100.0 * (end[role] - start[role]) / start[role] for role in ("server", "engine core")
            if start.get(role)}


def _growth(res: Result, scope: str) -> tuple[float, str]:
    if scope == "processes":
        role, pct = max(_role_growth(res).items(), key=lambda kv: kv[1])
        return pct, role
    return (res.growth_pct, "tree") if scope == "tree" else (res.own_growth_pct, "server")


def verdict(res: Result, alive: bool, scope: str = "server") -> tuple[bool, str]:
    """PASS: no lost answer, no 5xx, no innocent failure, every expected status met, RSS growth under RSS_LIMIT_PCT
    (of the server process, or with scope "tree" of it and its children too), every KV block free, control calls
    200."""
    tally, metrics = res.tally, res.metrics
    growth, grew = _growth(res, scope)
    bad_control = [c for c in res.control if " -> 200 " not in c]
    reasons = [f"{count(tally.lost)} lost", f"{count(tally.fivexx)} 5xx", f"{count(tally.innocent)} innocent failures",
               f"{count(tally.unexpected)} unexpected statuses", f"server rss {res.own_growth_pct:+.1f}%",
               f"tree rss {res.growth_pct:+.1f}% (start {_mib(res.rss[0])}, peak {_mib(res.peak)}, "
               f"end {_mib(res.rss[1])} MiB)"]
    if res.roles[1]:
        reasons.append("by process " + ", ".join(f"{role} {_mib(res.roles[0].get(role, 0))}->{_mib(kib)} MiB"
                                                 for role, kib in res.roles[1].items()))
    ok = not (tally.lost or tally.fivexx or tally.innocent or tally.unexpected or bad_control)
    ok = ok and growth < RSS_LIMIT_PCT and alive
    if growth >= RSS_LIMIT_PCT:
        reasons.append(f"{grew} rss grew {growth:+.1f}%, limit {RSS_LIMIT_PCT}%")
    if KV_FREE in metrics and KV_TOTAL in metrics:
        free, total = int(metrics[KV_FREE]), int(metrics[KV_TOTAL])
        reasons.append(f"kv {free}/{total} free")
        ok = ok and free == total
    else:
        reasons.append(f"kv gauges missing ({KV_FREE}, {KV_TOTAL})")
        ok = False
    if bad_control:
        reasons.append(f"{len(bad_control)} control calls failed")
    if not alive:
        reasons.append("server died")
    return ok, f"soak: {'PASS' if ok else 'FAIL'} ({', '.join(reasons)})"


def print_bucket(title: str, bucket: dict[str, list[str]], examples: int = 3) -> None:
    """Each distinct outcome once, with its count and up to `examples` distinct requests that caused it."""
    print(f"{title}: {count(bucket)}")
    for key, reqs in sorted(bucket.items(), key=lambda kv: -len(kv[1])):
        print(f"  {len(reqs)}x {key}")
        seen: dict[str, str] = {}
        for r in reqs:
            seen.setdefault(r.split(": ", 1)[1], r)
        for r in list(seen.values())[:examples]:
            print(f"      {r}")


def print_watched(tally: Tally) -> None:
    """Per kind with expected statuses: what it got, its largest answer, its slowest, the RSS its answers saw, and
    one answer per status."""
    if not tally.watched:
        return
    print("kinds with expected statuses (status counts; largest body; slowest; server tree rss at answers, MiB):")
    for kind, rows in sorted(tally.watched.items()):
        statuses = Counter(r[0] for r in rows)
        rss = [r[3] for r in rows if r[3]]
        span = f"{_mib(min(rss))}-{_mib(max(rss))}" if rss else "-"
        print(f"  {kind:22s} {', '.join(f'{s}: {n}' for s, n in sorted(statuses.items()))}; "
              f"{max(r[1] for r in rows)} bytes; {max(r[2] for r in rows):.1f}s; rss {span}")
        for status in sorted(statuses):
            print(f"      {status}: {next(r[4] for r in rows if r[0] == status)[:220]!r}")


def print_latency(tally: Tally) -> None:
    """Innocent requests' seconds (streams to their end): a hostile kind that stalls the server shows here."""
    s = sorted(tally.innocent_s)
    if s:
        print(f"innocent latency (s): p50 {s[len(s) // 2]:.2f}, p90 {s[int(len(s) * 0.9)]:.2f}, "
              f"p99 {s[int(len(s) * 0.99)]:.2f}, max {s[-1]:.2f} over {len(s)}")


def report(args: argparse.Namespace, res: Result, errors: list[str]) -> None:
    tally, metrics, (rss0, rss1) = res.tally, res.metrics, res.rss
    print(f"minutes: {res.elapsed / 60:.2f} (asked {args.minutes}), concurrency {args.concurrency}, "
          f"seed {args.seed}, hostile share {args.hostile_share}, warm-up {args.warmup_minutes:g} min"
          + (", --hostile (turn-3 kinds)" if args.hostile else ""))
    print(f"requests sent: {sum(tally.sent.values())} (warm-up included)")
    for kind, n in sorted(tally.sent.items()):
        print(f"  {kind:26s} {n}")
    print("responses by status: " + ", ".join(f"{s}: {n}" for s, n in sorted(tally.statuses.items())))
    print(f"expected 503 aborts (in flight during /pause abort): {tally.expected_aborts}")
    print("(times: seconds since the soak began, warm-up included)")
    for line in res.control:
        print(f"control: {line}")
    print_watched(tally)
    print_latency(tally)
    print_bucket("hostile requests answered 200 (listed, not a failure)", tally.hostile_accepted)
    print_bucket("lost answers", tally.lost)
    print_bucket("5xx answers", tally.fivexx)
    print_bucket("innocent requests answered neither 200 nor 5xx", tally.innocent)
    print_bucket("requests given a status they must not get", tally.unexpected)
    print(f"server tracebacks: {len(errors)} distinct" + "".join(f"\n  {e}" for e in errors[:20]))
    kv = (f"{int(metrics[KV_FREE])}/{int(metrics[KV_TOTAL])}" if KV_FREE in metrics and KV_TOTAL in metrics
          else f"not exposed (expected gauges {KV_FREE} and {KV_TOTAL})")
    print(f"kv blocks free/total at end: {kv}")
    step = max(1, len(res.rss_samples) // 6)
    print(f"server process rss: start {_mib(res.own_rss[0])} MiB, end {_mib(res.own_rss[1])} MiB, "
          f"growth {res.own_growth_pct:+.2f}%")
    print(f"server tree rss (server + engine core + template workers): start {_mib(rss0)} MiB, "
          f"peak {_mib(res.peak)} MiB, end {_mib(rss1)} MiB, growth {res.growth_pct:+.2f}%; "
          f"warm-up peak {_mib(res.warm_peak)} MiB; "
          "during the run (MiB): " + " ".join(_mib(k) for k in res.rss_samples[step - 1::step]))
