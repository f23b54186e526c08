#!/usr/bin/python3
"""Black-box recovery check of `kdedup run`, with clients independent of kdedup.

Starts `kdedup testbroker`, two `kdedup run` members in one group (each with
its own state dir, as each pod has its own volume), and produces a keyed
stream with reused identities through confluent-kafka (Debian's
python3-confluent-kafka: librdkafka, but none of kdedup's code). While it
runs, members are killed with SIGKILL and restarted (--mode kill), or a
second member joins and leaves with SIGTERM over and over (--mode scale).
Then the whole output is judged against an exact sliding-window oracle of
the whole input, matched by the provenance headers:

  lost          a record that is new given what was delivered (no delivery
                of its identity within the window before it) but is not in
                the output; with a probabilistic filter these are its false
                positives, counted and bounded by the binomial bound of fpp
  false neg.    an emitted record whose identity was emitted within the
                window before it (age <= window)
  emitted twice two output records with the same source offset
  out of order  per output partition and source partition, a source offset
                lower than one emitted before it

The oracle's clock is the partition clock (the largest timestamp so far);
an age in (window, window + one tick] may go either way.

Exit status 0 when every count is within bounds, 1 otherwise, 2 on a setup
error. A JSON summary is printed as the last line.
"""

import argparse
import json
import math
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time

from confluent_kafka import Consumer, Producer, TopicPartition


def parse_duration_ms(text):
    units = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000}
    for suffix in ("ms", "s", "m", "h"):
        if text.endswith(suffix) and text[: -len(suffix)].isdigit():
            return int(text[: -len(suffix)]) * units[suffix]
    raise ValueError(f"bad duration {text!r}")


class Broker:
    def __init__(self, kdedup, partitions, workdir):
        self.log = open(os.path.join(workdir, "broker.log"), "w")
        self.proc = subprocess.Popen(
            [kdedup, "testbroker", "--brokers", "1", "--topic", f"in:{partitions}",
             "--topic", f"out:{partitions}", "--topic", "dlq:1"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, text=True)
        self.bootstrap = self.proc.stdout.readline().strip()
        if not self.bootstrap:
            raise RuntimeError("the test broker printed no bootstrap line")

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


class Member:
    """One `kdedup run` process with its own config, state dir and log."""

    def __init__(self, name, kdedup, workdir, bootstrap, args):
        self.name = name
        self.kdedup = kdedup
        self.config = os.path.join(workdir, f"{name}.yaml")
        self.log_path = os.path.join(workdir, f"{name}.log")
        filter_lines = f"  type: {args.filter}\n"
        if args.filter != "exact":
            filter_lines += f"  fpp: {args.fpp}\n  capacity: {args.capacity}\n"
            if args.confirm:
                filter_lines += "  confirm_store: true\n"
        with open(self.config, "w") as f:
            f.write(
                "group_id: blackbox\n"
                "input:\n  topics: [in]\n"
                f"output:\n  topic: out\n  partitioning: {args.partitioning}\n"
                "identity:\n  extractor: key\n  salt: blackbox-salt-0123456789\n"
                f"window: {args.window}\n"
                f"filter:\n{filter_lines}"
                "threads: 2\n"
                "on_invalid: dlq\ndlq_topic: dlq\n"
                "commit_interval: 500ms\n"
                "shutdown_timeout: 20s\n"
                f"kafka:\n  bootstrap.servers: \"{bootstrap}\"\n"
                "consumer:\n  session.timeout.ms: \"6000\"\n  heartbeat.interval.ms: \"500\"\n"
                "metrics:\n  address: \"\"\n"
                f"state:\n  dir: {os.path.join(workdir, name + '-state')}\n"
                "  snapshot_interval: 2s\n")
        self.proc = None

    def start(self):
        log = open(self.log_path, "a")
        self.proc = subprocess.Popen([self.kdedup, "run", "--config", self.config],
                                     stdout=log, stderr=log)

    def running(self):
        return self.proc is not None and self.proc.poll() is None

    def kill9(self):
        if self.running():
            self.proc.kill()
        if self.proc is not None:
            self.proc.wait()

    def stop(self, timeout=60):
        if not self.running():
            return self.proc.returncode if self.proc else 0
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            return -1

    def log_tail(self, lines=30):
        with open(self.log_path, errors="replace") as f:
            return "".join(f.readlines()[-lines:])


def produce(bootstrap, args, rng, stop_flag, counter):
    """Keyed records at args.rate a second; args.reuse of them repeat an
    identity: half of those one of args.hot popular identities (repeated
    every few seconds all run long, so each is emitted again right after its
    window ends: first-test-then-set chains across every hand-over), half an
    identity first seen within the last 2 windows (so repeats fall on both
    sides of the window's edge)."""
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True,
                         "linger.ms": 5})
    window_s = parse_duration_ms(args.window) / 1000.0
    recent = []  # (first seen, id), oldest first
    next_id = 0
    start = time.time()
    for i in range(args.records):
        if stop_flag.is_set():
            break
        now = time.time()
        while recent and now - recent[0][0] > 2 * window_s:
            recent.pop(0)
        if rng.random() < args.reuse:
            if args.hot > 0 and (not recent or rng.random() < 0.5):
                ident = f"hot-{rng.randrange(args.hot)}"
            else:
                ident = rng.choice(recent)[1]
        else:
            ident = f"id-{next_id}"
            next_id += 1
            recent.append((now, ident))
        producer.produce("in", key=ident, value=json.dumps({"id": ident, "seq": i}))
        counter[0] = i + 1
        if i % 100 == 99:
            producer.poll(0)
            target = start + (i + 1) / args.rate
            if target > time.time():
                time.sleep(target - time.time())
    if producer.flush(30) != 0:
        raise RuntimeError("the producer could not deliver every record")


def read_topic(bootstrap, topic, partitions):
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "blackbox-reader",
                         "enable.auto.commit": False, "enable.partition.eof": True})
    records = []
    ends = {}
    for p in range(partitions):
        low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
        if topic == "in" and low != 0:
            raise RuntimeError(f"input partition {p} was truncated by the broker (low {low})")
        if high > low:
            ends[p] = high
    consumer.assign([TopicPartition(topic, p, 0) for p in ends])
    remaining = dict(ends)
    deadline = time.time() + 120
    while remaining and time.time() < deadline:
        m = consumer.poll(1.0)
        if m is None or m.error():
            continue
        records.append(m)
        if m.offset() + 1 >= remaining.get(m.partition(), 0):
            remaining.pop(m.partition(), None)
    consumer.close()
    if remaining:
        raise RuntimeError(f"could not read {topic} to its end: {remaining}")
    return records


def committed_to_end(bootstrap, partitions):
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "blackbox",
                         "enable.auto.commit": False})
    try:
        tps = consumer.committed([TopicPartition("in", p) for p in range(partitions)], timeout=10)
        for tp in tps:
            _, high = consumer.get_watermark_offsets(TopicPartition("in", tp.partition), timeout=10)
            if tp.offset < high:
                return False
        return True
    finally:
        consumer.close()


def recovery_cost(members):
    """Rebuilds and restores from the members' logs: how many, records
    replayed, output records read on assignment, seconds from assignment to
    the end of the replay."""
    done = re.compile(r"recovery done \((\w+)\) in ([0-9.]+) s, (\d+) records replayed")
    planned = re.compile(r"output(?: tail)? (\d+) ms for (\d+) records")
    cost = {"rebuilds": 0, "restores": 0, "rebuild_seconds": 0.0, "replayed": 0,
            "output_records_read": 0, "output_read_ms": 0}
    for m in members:
        with open(m.log_path, errors="replace") as f:
            for line in f:
                d = done.search(line)
                if d:
                    kind = "rebuilds" if d.group(1) == "rebuild_from_window" else "restores"
                    cost[kind] += 1
                    if kind == "rebuilds":
                        cost["rebuild_seconds"] += float(d.group(2))
                    cost["replayed"] += int(d.group(3))
                p = planned.search(line)
                if p:
                    cost["output_read_ms"] += int(p.group(1))
                    cost["output_records_read"] += int(p.group(2))
    cost["rebuild_seconds"] = round(cost["rebuild_seconds"], 2)
    return cost


def judge(inputs, outputs, window_ms, tick_ms, fpp):
    header = lambda m, name: next((v for k, v in (m.headers() or []) if k == name), None)
    emitted = {}  # (partition, offset) -> count
    order_problems = 0
    order_examples = []
    last = {}  # (output partition, source partition) -> source offset
    for m in sorted(outputs, key=lambda m: (m.partition(), m.offset())):
        src_p = header(m, "kdedup-source-partition")
        src_o = header(m, "kdedup-source-offset")
        if src_p is None or src_o is None:
            continue
        key = (int(src_p), int(src_o))
        emitted[key] = emitted.get(key, 0) + 1
        if emitted[key] == 1:
            k = (m.partition(), key[0])
            if k in last and key[1] < last[k]:
                order_problems += 1
                if len(order_examples) < 5:
                    order_examples.append(f"out of order: out[{m.partition()}]@{m.offset()} <- "
                                          f"in[{key[0]}]@{key[1]} after in[{key[0]}]@{last[k]}")
            last[k] = max(last.get(k, -1), key[1])
        elif len(order_examples) < 5:
            order_examples.append(f"emitted twice: in[{key[0]}]@{key[1]} again at "
                                  f"out[{m.partition()}]@{m.offset()}")
    twice = sum(c - 1 for c in emitted.values() if c > 1)
    lost = fn = new = ambiguous = 0
    examples = order_examples
    by_partition = {}
    for m in inputs:
        by_partition.setdefault(m.partition(), []).append(m)
    for p, records in by_partition.items():
        records.sort(key=lambda m: m.offset())
        delivered = {}
        clock = 0
        for m in records:
            clock = max(clock, m.timestamp()[1])
            ident = m.key().decode()
            out = (p, m.offset()) in emitted
            age = clock - delivered[ident] if ident in delivered else None
            if age is not None and age <= window_ms:
                if out:
                    fn += 1
                    if len(examples) < 5:
                        examples.append(f"false negative: in[{p}]@{m.offset()} {ident} age {age}")
            elif age is not None and age <= window_ms + tick_ms:
                ambiguous += 1
            else:
                new += 1
                if not out:
                    lost += 1
                    if len(examples) < 5:
                        examples.append(f"lost: in[{p}]@{m.offset()} {ident} age {age}")
            if out:
                delivered[ident] = clock
    bound = 0 if fpp == 0 else math.ceil(fpp * new + 4 * math.sqrt(fpp * new) + 5)
    return {"input": len(inputs), "output": len(outputs), "new": new, "ambiguous": ambiguous,
            "lost": lost, "lost_allowed": bound, "false_negatives": fn, "emitted_twice": twice,
            "out_of_order": order_problems, "examples": examples}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kdedup", required=True)
    ap.add_argument("--window", default="20s")
    ap.add_argument("--filter", default="exact", choices=["exact", "timer", "aging"])
    ap.add_argument("--fpp", type=float, default=0.001)
    ap.add_argument("--capacity", type=int, default=20000)
    ap.add_argument("--partitioning", default="input", choices=["input", "key"])
    ap.add_argument("--records", type=int, default=60000)
    ap.add_argument("--rate", type=float, default=1000)
    ap.add_argument("--reuse", type=float, default=0.4)
    ap.add_argument("--hot", type=int, default=1000, help="popular identities")
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--mode", default="kill", choices=["kill", "scale"])
    ap.add_argument("--confirm", action="store_true",
                    help="confirmed mode (filter.confirm_store): no record may be lost")
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--workdir", default=None)
    args = ap.parse_args()
    seed = args.seed if args.seed is not None else random.randrange(1 << 32)
    rng = random.Random(seed)
    print(f"blackbox: seed {seed}, window {args.window}, filter {args.filter}, mode {args.mode}, "
          f"{args.records} records at {args.rate}/s", flush=True)
    workdir = args.workdir or tempfile.mkdtemp(prefix="kdedup-blackbox-")
    window_ms = parse_duration_ms(args.window)
    tick_ms = -(-window_ms // 192)

    broker = Broker(args.kdedup, args.partitions, workdir)
    members = [Member(n, args.kdedup, workdir, broker.bootstrap, args) for n in ("a", "b")]
    faults = 0
    try:
        members[0].start()
        if args.mode == "kill":
            members[1].start()
        stop_flag = threading.Event()
        counter = [0]
        errors = []

        def feed():
            try:
                produce(broker.bootstrap, args, rng, stop_flag, counter)
            except Exception as e:  # reported below
                errors.append(str(e))

        feeder = threading.Thread(target=feed)
        feeder.start()
        while feeder.is_alive():
            if args.mode == "kill":
                time.sleep(rng.uniform(2.0, 7.0))
                if not feeder.is_alive():
                    break
                victim = rng.choice(members)
                victim.kill9()
                time.sleep(rng.uniform(0.0, 2.0))
                victim.start()
                faults += 1
                print(f"  kill -9 {victim.name} at record {counter[0]}", flush=True)
            else:
                b = members[1]
                time.sleep(rng.uniform(4.0, 9.0))
                if not feeder.is_alive():
                    break
                if b.running():
                    code = b.stop()
                    print(f"  {b.name} left (SIGTERM, exit {code}) at record {counter[0]}",
                          flush=True)
                else:
                    b.start()
                    print(f"  {b.name} joined at record {counter[0]}", flush=True)
                faults += 1
        feeder.join()
        if errors:
            raise RuntimeError(errors[0])
        if not members[0].running():
            members[0].start()
        deadline = time.time() + 120
        while not committed_to_end(broker.bootstrap, args.partitions):
            if time.time() > deadline:
                raise RuntimeError("the group did not commit the whole input in 120 s\n" +
                                   members[0].log_tail())
            time.sleep(1)
        for m in members:
            code = m.stop()
            if code not in (0, None):
                raise RuntimeError(f"{m.name} exited {code}\n" + m.log_tail())
        inputs = read_topic(broker.bootstrap, "in", args.partitions)
        outputs = read_topic(broker.bootstrap, "out", args.partitions)
    except Exception as e:
        print(f"blackbox: setup failed: {e}", file=sys.stderr)
        for m in members:
            m.kill9()
        broker.stop()
        return 2
    broker.stop()
    # Confirmed mode promises what the exact filter does: nothing lost.
    fpp = 0.0 if args.filter == "exact" or args.confirm else args.fpp
    report = judge(inputs, outputs, window_ms, tick_ms, fpp)
    report.update({"seed": seed, "window": args.window, "filter": args.filter,
                   "confirm_store": args.confirm, "mode": args.mode,
                   "faults": faults, "partitioning": args.partitioning, "workdir": workdir})
    report["recovery"] = recovery_cost(members)
    for e in report["examples"]:
        print("  " + e)
    ok = (report["lost"] <= report["lost_allowed"] and report["false_negatives"] == 0 and
          report["emitted_twice"] == 0 and report["out_of_order"] == 0)
    report["ok"] = ok
    print(json.dumps(report), flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
