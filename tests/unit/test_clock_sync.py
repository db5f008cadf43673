"""Clock-sync rounds agreed through the store: a late rank meets the peers that retried."""

import threading

import pytest
import time

from rankstream.producers.clock_sync import ClockRounds


class MemoryStore:
    """The c10d store calls the clock sync makes (add, set, wait, compare_set), in memory."""

    def __init__(self):
        self._values = {}
        self._changed = threading.Condition()

    def add(self, key, amount):
        with self._changed:
            value = int(self._values.get(key, b"0")) + amount
            self._values[key] = str(value).encode()
            self._changed.notify_all()
            return value

    def set(self, key, value):
        with self._changed:
            self._values[key] = value if isinstance(value, bytes) else value.encode()
            self._changed.notify_all()

    def wait(self, keys, timeout):
        with self._changed:
            if not self._changed.wait_for(lambda: all(k in self._values for k in keys), timeout.total_seconds()):
                raise RuntimeError(f"Socket Timeout waiting for {keys}")

    def compare_set(self, key, expected, desired):
        with self._changed:
            current = self._values.get(key)
            if current == expected.encode() or (current is None and expected == ""):
                self._values[key] = desired.encode()
            return self._values.get(key, b"")


def retrying_rank(store, start_after_s, results, failures, samples_wanted=1):
    """A rank's clock thread: joins after ``start_after_s``, retries 0.1 s after each failure,
    gives up after 5 s."""
    time.sleep(start_after_s)
    rounds = ClockRounds(store, "run", world_size=2, timeout_s=0.3)
    deadline = time.monotonic() + 5
    while len(results) < samples_wanted and time.monotonic() < deadline:
        try:
            results.append(rounds.sample())
        except RuntimeError:
            failures.append(rounds.round)
            time.sleep(0.1)


def test_a_late_rank_joins_the_round_its_peer_retries_in():
    store = MemoryStore()
    early, late, early_failures, late_failures = [], [], [], []
    threads = [threading.Thread(target=retrying_rank, args=(store, 0.0, early, early_failures)),
               threading.Thread(target=retrying_rank, args=(store, 0.5, late, late_failures))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert early and late, (early_failures, late_failures)  # both got a sample
    assert early[0].round == late[0].round >= 1  # in the same round, after the early rank gave up on round 0
    assert early_failures and 0 in early_failures


def test_rounds_that_succeed_move_on_together():
    store = MemoryStore()
    first, second = [], []
    threads = [threading.Thread(target=retrying_rank, args=(store, 0.0, samples, [], 3)) for samples in (first, second)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert [s.round for s in first] == [s.round for s in second] == [0, 1, 2]


def test_a_round_waiting_for_an_absent_peer_does_not_hold_up_the_job_s_own_store_calls():
    """The round waits on a connection of its own: on the training thread's client, torch's
    ``new_group`` waited behind it for up to the round's timeout."""
    from datetime import timedelta

    import torch.distributed as dist

    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=30))
    store = dist.PrefixStore("default_pg/0/", server)
    rounds = ClockRounds(store, "run", world_size=2, timeout_s=6.0)
    waiting = threading.Thread(target=lambda: pytest.raises(Exception, rounds.sample))
    waiting.start()
    watcher = store.clone()  # looks on a client of its own
    while not watcher.check(["rankstream/clock/run/0/a/arrived"]):
        time.sleep(0.01)  # until the round is in its barrier, waiting for the absent peer
    asked = time.monotonic()
    store.set("the job's own key", b"1")  # what new_group does on the training thread
    took = time.monotonic() - asked
    waiting.join()
    assert took < 3.0  # it did not wait out the round's 6 s (a store call takes milliseconds)
