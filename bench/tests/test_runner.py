import unittest
from unittest import mock

from bench import runner


class FakeSession(runner.Session):
    """run_cell's retry logic with the measurements replaced by a script."""

    def __init__(self, results, retries=2):
        super().__init__("/repo", "/work", None, retries=retries, log=lambda *a: None)
        self.results = list(results)
        self.calls = 0

    def wait_quiet(self, max_wait=None):
        return 0.5

    def _attempt(self, scenario, proxy, run, attempt):
        self.calls += 1
        return dict(self.results.pop(0))


class RunCell(unittest.TestCase):
    def setUp(self):
        patcher = mock.patch.object(runner.time, "sleep", lambda s: None)
        patcher.start()
        self.addCleanup(patcher.stop)

    def test_quiet_first_attempt(self):
        s = FakeSession([{"status": "ok", "foreign_frac": 0.01}])
        c = s.run_cell("stream1", "nginx", 0)
        self.assertEqual((s.calls, c["attempts"], c["disturbed"]), (1, 1, False))
        self.assertEqual(c["scenario"], "stream1")

    def test_keeps_the_least_disturbed(self):
        s = FakeSession([{"status": "ok", "foreign_frac": 0.3, "x": 1},
                         {"status": "ok", "foreign_frac": 0.1, "x": 2},
                         {"status": "ok", "foreign_frac": 0.9, "x": 3}])
        c = s.run_cell("stream1", "nginx", 0)
        self.assertEqual((s.calls, c["x"], c["attempts"]), (3, 2, 3))
        self.assertTrue(c["disturbed"])
        self.assertEqual(c["attempt_foreign_frac"], [0.3, 0.1, 0.9])
        self.assertEqual(c["waited_for_quiet_s"], 1.5)

    def test_memory_cells_have_no_foreign_figure(self):
        s = FakeSession([{"status": "ok", "rest_kb": 1}])
        c = s.run_cell("mem-idle-2000", "nginx", 0)
        self.assertEqual((s.calls, c["disturbed"]), (1, False))

    def test_not_applicable_is_not_attempted(self):
        s = FakeSession([])
        c = s.run_cell("socks-1m", "nginx", 0)
        self.assertEqual((s.calls, c["status"]), (0, "n/a"))

    def test_failure_stops_retrying(self):
        s = FakeSession([{"status": "ok", "foreign_frac": 0.5},
                         {"status": "n/a", "reason": "gone"}])
        c = s.run_cell("stream1", "3proxy", 0)
        self.assertEqual((s.calls, c["status"]), (2, "ok"))


if __name__ == "__main__":
    unittest.main()


class StartProxy(unittest.TestCase):
    """A proxy that is slow to listen is an error of that cell; one that
    exits is n/a (bench.py then skips its later cells of that service)."""

    def start(self, exits):
        import tempfile

        class P:
            pid = 1

            def poll(self):
                return 1 if exits else None
        s = runner.Session("/repo", "/work", "/b/3proxy", log=lambda *a: None)
        with tempfile.TemporaryDirectory() as d, \
                mock.patch.object(runner.procs, "spawn", lambda *a, **k: P()), \
                mock.patch.object(runner.procs, "wait_listening", lambda *a, **k: False), \
                mock.patch.object(runner.procs, "stop", lambda p, grace=5: 1 if exits else -15):
            s.start_proxy("3proxy", "http", d)

    def test_slow_is_an_error(self):
        with self.assertRaisesRegex(runner.StartTimeout, "did not listen within 5 s"):
            self.start(exits=False)

    def test_exit_is_not_applicable(self):
        with self.assertRaisesRegex(runner.NotApplicable, r"did not serve http \(exit 1\)"):
            self.start(exits=True)
