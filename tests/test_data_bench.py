"""test_data_bench.py - a short `hpcdl bench data` run: the header, one row per
loader with its rate, the consumer and target lines, and a correctness footer
that must say 0 wrong samples (every loader's samples compared with memory);
and its usage errors. No timing is asserted."""
import json
import subprocess
import sys

import pytest

BENCH = [sys.executable, "-m", "hpcdl", "bench", "data"]


def test_bench_data_table_and_check(tmp_path):
    out = tmp_path / "rows.json"
    r = subprocess.run(BENCH + ["--time-budget", "0.3", "--batch", "64", "--dir", str(tmp_path),
                                "--json", str(out)], capture_output=True, text=True,
                       timeout=180)
    assert r.returncode == 0, r.stdout + r.stderr
    loaders = ["memory", "naive-h5", "naive-h5-contig", "shards", "shards-grouped"]
    rows = [line.split() for line in r.stdout.splitlines() if line.split()[:1] and
            line.split()[0] in loaders]
    assert [row[0] for row in rows] == loaders
    assert all(float(row[5]) > 0 and row[-1] == "0" for row in rows)  # samples/s, #wrong
    assert "consumer: MLP 64-" in r.stdout and r.stdout.count("# target:") == 2
    assert "Wrong or missing samples: 0 OK" in r.stdout
    doc = json.load(open(out))
    assert [row["loader"] for row in doc["rows"]] == loaders
    assert list(tmp_path.iterdir()) == [out]  # its scratch files are gone


@pytest.mark.parametrize("args, message", [
    (["--shape", "3,x"], "--shape"), (["--batch", "0"], "--batch must be"),
    (["--workers", "-1"], ">= 0"), (["-n", "0"], "-n must be")])
def test_bench_data_usage_errors(args, message):
    r = subprocess.run(BENCH + args, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and message in r.stderr, r.stderr
