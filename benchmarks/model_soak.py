"""The stateful model test of tests/test_model.py, run for longer: cases tried per minute.

``make test`` runs each state machine for a bounded, derandomized number of sequences. This
script runs them with fresh random sequences for ``--minutes`` each and prints, per machine,
the sequences (cases) and steps tried, and the rate. Any loss, repeat or rank split stops it
with Hypothesis's shortest failing sequence and exit status 1.

Machines: ``local`` (Stream and ingest.DataLoader), ``follow`` (a followed directory that
grows between loops), ``ray`` (RayStream ranks in this process and in Ray tasks, each rank's
state taken in its task, readers killed, resumes with other world sizes; starts a local Ray
of 8 logical CPUs), ``pack`` (Tokenize + Pack, resumed in a Stream or a DataLoader of 0-2
workers, token by token), ``mix`` (a two-source ingest.Mix, tokenized and packed, the same
stops and transports) and ``raypack`` (Tokenize + Pack resumed in a Stream, a DataLoader of 0
or 2 workers or a RayStream of 1-3 ranks, each rank's state taken in its own process), the
last three from tests/test_pack_model.py.

    .venv/bin/python benchmarks/model_soak.py [--minutes 2] [--machines local,ray,pack,mix]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, run_state_machine_as_test

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from tests import test_model, test_pack_model  # noqa: E402  (the machines live with their tests)

ROUND = 10
"""Sequences per call of Hypothesis: the clock is checked between rounds."""


def counted(machine: type[RuleBasedStateMachine], tally: dict[str, int]) -> type[Any]:
    """``machine`` counting its sequences (instances) and steps (invariant checks)."""

    class Counted(machine):  # type: ignore[valid-type,misc]
        def __init__(self) -> None:
            super().__init__()
            tally["cases"] += 1

        @invariant()
        def count_step(self) -> None:
            tally["steps"] += 1

    Counted.__name__ = machine.__name__
    return Counted


def soak(name: str, machine: type[RuleBasedStateMachine], minutes: float) -> dict[str, float]:
    tally = {"cases": 0, "steps": 0}
    cls = counted(machine, tally)
    start = time.monotonic()
    while time.monotonic() - start < minutes * 60:
        run_state_machine_as_test(
            cls,
            settings=settings(
                max_examples=ROUND,
                stateful_step_count=12,
                deadline=None,
                suppress_health_check=list(HealthCheck),
                database=None,
            ),
        )
    elapsed = time.monotonic() - start
    return {**tally, "seconds": elapsed, "per_minute": tally["cases"] * 60 / elapsed}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=2.0, help="per machine")
    parser.add_argument("--machines", default="local,follow,ray,pack,mix,raypack")
    args = parser.parse_args()
    names = [m for m in args.machines.split(",") if m]
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["PACK_MODEL_ROOT"] = os.path.join(tmp, "pack")
        data = test_model.make_data(tmp)
        test_model.LocalMachine.data = data
        test_model.RayMachine.data = data
        machines: dict[str, type[RuleBasedStateMachine]] = {
            "local": test_model.LocalMachine,
            "follow": test_model.FollowMachine,
            "ray": test_model.RayMachine,
            "pack": test_pack_model.PackMachine,
            "mix": test_pack_model.MixMachine,
            "raypack": test_pack_model.RayPackMachine,
        }
        unknown = set(names) - set(machines)
        if unknown:
            parser.error(f"unknown machines {sorted(unknown)}; choose from {sorted(machines)}")
        if {"ray", "raypack"} & set(names):
            import ray

            ray.init(
                address="local",
                num_cpus=8,
                include_dashboard=False,
                log_to_driver=False,
                runtime_env={"env_vars": {"PYTHONPATH": ROOT}},  # tasks import tests.test_model
            )
        print(f"{'machine':<8} {'cases':>6} {'steps':>7} {'seconds':>8} {'cases/min':>10}")
        failed = False
        for name in names:
            try:
                got = soak(name, machines[name], args.minutes)
            except Exception as e:  # Hypothesis has printed the shortest failing sequence
                print(f"{name:<8} FAILED: {type(e).__name__}: {str(e).splitlines()[0]}")
                failed = True
                continue
            print(
                f"{name:<8} {got['cases']:>6.0f} {got['steps']:>7.0f} "
                f"{got['seconds']:>8.1f} {got['per_minute']:>10.1f}"
            )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
