import random

from shardstream.shuffle import shuffle_buffer


class Counting:
    """An input that records how far ahead of the output the buffer has read."""

    def __init__(self, n):
        self.n, self.read = n, 0

    def __iter__(self):
        for i in range(self.n):
            self.read = i + 1
            yield i


def test_output_is_a_permutation_and_memory_is_bounded():
    source = Counting(1000)
    out = []
    for item in shuffle_buffer(source, capacity_samples=50, rng=random.Random(0)):
        assert source.read - len(out) <= 50 + 1  # the buffer plus the item being swapped in
        out.append(item)
    assert sorted(out) == list(range(1000)) and out != list(range(1000))


def test_seeded_and_repeatable():
    a = list(shuffle_buffer(range(300), capacity_samples=64, rng=random.Random(5)))
    assert a == list(shuffle_buffer(range(300), capacity_samples=64, rng=random.Random(5)))
    assert a != list(shuffle_buffer(range(300), capacity_samples=64, rng=random.Random(6)))


def test_small_capacity_keeps_order():
    assert list(shuffle_buffer(range(10), capacity_samples=1, rng=random.Random(0))) == list(range(10))
    assert list(shuffle_buffer([], capacity_samples=10, rng=random.Random(0))) == []


def test_ramp_yields_after_initial_items_and_grows_to_capacity():
    source = Counting(1000)
    out, held = [], []
    for item in shuffle_buffer(source, capacity_samples=100, rng=random.Random(0), initial_samples=10):
        held.append(source.read - len(out) - 1)  # in the buffer while this item is yielded
        out.append(item)
    assert sorted(out) == list(range(1000))
    assert held[0] == 10  # the first item came after 11 were read, not 101
    assert held[:90] == list(range(10, 100))  # growing by one per item yielded
    assert set(held[90:900]) == {100}  # then full, as without a ramp
