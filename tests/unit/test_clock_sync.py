"""Clock-sync rounds agreed through the store: a late rank meets the peers that retried."""

import threading
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
