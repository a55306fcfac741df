import unittest

from bench import stats


def stat(**kw):
    d = dict.fromkeys(("user", "nice", "system", "idle", "iowait", "irq", "softirq",
                       "steal", "guest", "guest_nice"), 0)
    d.update(kw)
    return d


class CpuBusy(unittest.TestCase):
    def test_wall_minus_idle_beats_tick_sum(self):
        # 10 s at HZ=100: the ticks caught 2 s of work, but the CPU was idle
        # only 5 s: busy is 5 s.
        b = stat()
        a = stat(user=100, system=50, softirq=50, idle=480, iowait=10, steal=10)
        r = stats.cpu_busy(b, a, 10.0, 100)
        self.assertAlmostEqual(r["wall"], 5.0)
        self.assertAlmostEqual(r["ticks"], 2.0)
        self.assertAlmostEqual(r["util"], 0.5)

    def test_clamped(self):
        r = stats.cpu_busy(stat(), stat(idle=1200), 10.0, 100)
        self.assertEqual(r["wall"], 0.0)
        r = stats.cpu_busy(stat(), stat(), 2.0, 100)
        self.assertEqual(r["util"], 1.0)


class Pace(unittest.TestCase):
    def test_who(self):
        self.assertEqual(stats.pace_setter(0.95, 0.5), "proxy")
        self.assertEqual(stats.pace_setter(0.5, 0.90), "cli+org")
        self.assertEqual(stats.pace_setter(0.99, 0.99), "both")
        self.assertEqual(stats.pace_setter(0.89, 0.2), "-")


class Summaries(unittest.TestCase):
    def test_median(self):
        self.assertEqual(stats.median([3, 1, 2]), 2)
        self.assertEqual(stats.median([4, 1, 2, 3]), 2.5)
        self.assertIsNone(stats.median([]))
        self.assertEqual(stats.median([None, 5]), 5)

    def test_spread(self):
        self.assertAlmostEqual(stats.spread([9, 10, 11]), 0.2)
        self.assertEqual(stats.spread([10]), 0.0)

    def test_summarize(self):
        s = stats.summarize([1.0, 3.0, 2.0, None])
        self.assertEqual((s["median"], s["min"], s["max"], s["n"]), (2.0, 1.0, 3.0, 3))
        self.assertIsNone(stats.summarize([None]))

    def test_mode(self):
        self.assertEqual(stats.mode_of(["a", "b", "b"]), "b")
        self.assertEqual(stats.mode_of(["a", "b"]), "a")
        self.assertIsNone(stats.mode_of([]))

    def test_rotate(self):
        self.assertEqual(stats.rotate([1, 2, 3], 0), [1, 2, 3])
        self.assertEqual(stats.rotate([1, 2, 3], 1), [2, 3, 1])
        self.assertEqual(stats.rotate([1, 2, 3], 5), [3, 1, 2])
        self.assertEqual(stats.rotate([], 2), [])



class PooledBuckets(unittest.TestCase):
    def test_runs_add_up_and_quantiles_come_from_all_of_them(self):
        a = [[100, 98], [5000, 2]]          # one run: p99 at 5 ms
        b = [[100, 100]]                     # another: nothing slow
        pooled = stats.pool_buckets([a, b])
        self.assertEqual(pooled, {100: 198, 5000: 2})
        # 2 slow of 200: p99 is the 198th, fast; p99.5 is slow.
        self.assertEqual(stats.bucket_quantile(pooled, 0.99), 100)
        self.assertEqual(stats.bucket_quantile(pooled, 0.995), 5000)
        self.assertEqual(stats.bucket_quantile(pooled, 0.5), 100)
        self.assertEqual(stats.bucket_quantile(pooled, 1.0), 5000)
        # The first value, not zero, for q = 0; nothing for an empty one.
        self.assertEqual(stats.bucket_quantile(pooled, 0.0), 100)
        self.assertIsNone(stats.bucket_quantile({}, 0.99))

    def test_bucket_order_does_not_matter(self):
        pooled = stats.pool_buckets([[[300, 1], [200, 1], [100, 2]]])
        self.assertEqual(stats.bucket_quantile(pooled, 0.75), 200)


if __name__ == "__main__":
    unittest.main()
