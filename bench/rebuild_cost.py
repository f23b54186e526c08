#!/usr/bin/python3
"""What a rebuild without snapshot costs: records read and seconds.

One partition holds --windows windows of a keyed stream with reused
identities (explicit timestamps, --rate records per second of event time);
one `kdedup run` processes all of it and stops gracefully, so the group has
committed everything. Then, --repeat times, each binary given starts alone
with an empty state dir: it must rebuild the partition's filter before it is
ready. Its log says how many input records it replayed, how many output
records it read and how long the recovery took (from assignment to the end
of the replay). Binaries alternate, so load on the machine hits them alike;
medians are printed side by side.

  bench/rebuild_cost.py --kdedup build/release/app/kdedup [--baseline OLD] \\
      [--window 20s] [--windows 3] [--rate 2000] [--repeat 3]
"""

import argparse
import json
import os
import re
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "e2e",
                                "blackbox"))
from recovery_blackbox import Broker, Member, committed_to_end, parse_duration_ms  # noqa: E402
from confluent_kafka import Producer  # noqa: E402


def produce_history(bootstrap, args):
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True,
                         "linger.ms": 5})
    window_ms = parse_duration_ms(args.window)
    total = int(args.windows * window_ms / 1000 * args.rate)
    start = int(time.time() * 1000) - args.windows * window_ms - 60_000
    hot = max(1, args.hot)
    for i in range(total):
        ts = start + int(i * 1000 / args.rate)
        # 40% repeats: half popular identities, half one seen shortly before.
        r = (i * 2654435761) % 100
        if r < 20:
            ident = f"hot-{(i * 40503) % hot}"
        elif r < 40 and i > 1000:
            ident = f"id-{i - 1 - (i * 7919) % 1000}"
        else:
            ident = f"id-{i}"
        producer.produce("in", key=ident, value=json.dumps({"id": ident, "seq": i}), partition=0,
                         timestamp=ts)
        if i % 1000 == 999:
            producer.poll(0)
    if producer.flush(60) != 0:
        raise RuntimeError("the producer could not deliver every record")
    return total


def recovery_from_log(text):
    done = re.search(r"recovery done \((\w+)\) in ([0-9.]+) s, (\d+) records replayed", text)
    read = re.search(r"output(?: tail)? (\d+) ms for (\d+) records", text)
    if not done:
        return None
    return {"reason": done.group(1), "seconds": float(done.group(2)),
            "replayed": int(done.group(3)), "output_read": int(read.group(2)) if read else 0}


class Args:  # what Member needs to write a config
    def __init__(self, window):
        self.filter = "exact"
        self.partitioning = "input"
        self.window = window
        self.fpp = 0.01
        self.capacity = 100000


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kdedup", required=True)
    ap.add_argument("--baseline", help="another kdedup binary measured side by side")
    ap.add_argument("--window", default="20s")
    ap.add_argument("--windows", type=int, default=3, help="history length, in windows")
    ap.add_argument("--rate", type=float, default=2000, help="records per second of event time")
    ap.add_argument("--hot", type=int, default=1000)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    workdir = tempfile.mkdtemp(prefix="kdedup-rebuild-")
    broker = Broker(args.kdedup, 1, workdir)
    try:
        total = produce_history(broker.bootstrap, args)
        first = Member("first", args.kdedup, workdir, broker.bootstrap, Args(args.window))
        first.start()
        deadline = time.time() + 120
        while not committed_to_end(broker.bootstrap, 1):
            if time.time() > deadline:
                raise RuntimeError("the first run did not commit everything\n" + first.log_tail())
            time.sleep(0.5)
        first.stop()
        binaries = [("kdedup", args.kdedup)] + ([("baseline", args.baseline)] if args.baseline
                                                 else [])
        results = {name: [] for name, _ in binaries}
        for round_ in range(args.repeat):
            for name, binary in binaries:
                m = Member(f"{name}-{round_}", binary, workdir, broker.bootstrap,
                           Args(args.window))
                m.start()
                got = None
                deadline = time.time() + 120
                while got is None and time.time() < deadline:
                    time.sleep(0.2)
                    with open(m.log_path, errors="replace") as f:
                        got = recovery_from_log(f.read())
                m.stop()
                shutil.rmtree(os.path.join(workdir, f"{name}-{round_}-state"), ignore_errors=True)
                if got is None:
                    raise RuntimeError(f"{name} did not finish its recovery\n" + m.log_tail())
                results[name].append(got)
    finally:
        broker.stop()
    print(f"rebuild of one partition: {total} input records ({args.windows} windows of "
          f"{args.window} at {args.rate:g}/s), window {args.window}; medians of {args.repeat}")
    print(f"{'binary':<10} {'reason':<20} {'input replayed':>15} {'output read':>12} "
          f"{'recovery s':>11}")
    for name, runs in results.items():
        print(f"{name:<10} {runs[0]['reason']:<20} "
              f"{statistics.median(r['replayed'] for r in runs):>15.0f} "
              f"{statistics.median(r['output_read'] for r in runs):>12.0f} "
              f"{statistics.median(r['seconds'] for r in runs):>11.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
