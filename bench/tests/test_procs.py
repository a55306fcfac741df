import unittest

from bench import procs


def st(pid, ppid, ut, stime=0, cut=0, start=1, comm="x", kthread=False):
    return {"pid": pid, "ppid": ppid, "comm": comm, "utime": ut, "stime": stime,
            "cutime": cut, "cstime": 0, "starttime": start,
            "flags": 0x00200000 if kthread else 0}


def stat(user=0, system=0):
    return {"user": user, "nice": 0, "system": system}


class Descendants(unittest.TestCase):
    def test_tree(self):
        s = {p["pid"]: p for p in [st(1, 0, 0), st(10, 1, 0), st(11, 10, 0), st(12, 10, 0),
                                    st(20, 1, 0)]}
        self.assertEqual(sorted(procs.descendants(10, s)), [10, 11, 12])


class Foreign(unittest.TestCase):
    def setUp(self):
        # 10 is the harness; 11 its child; 30 a stranger; 2 a kernel thread.
        self.before = {p["pid"]: p for p in [
            st(1, 0, 0), st(10, 1, 100), st(11, 10, 50), st(30, 1, 10, comm="cargo"),
            st(40, 1, 5, comm="bash"), st(2, 0, 0, kthread=True)]}

    def after(self, **changes):
        a = {k: dict(v) for k, v in self.before.items()}
        for pid, fields in changes.items():
            a[int(pid[1:])].update(fields)
        return a

    def test_quiet(self):
        sec, top = procs.foreign_cpu(self.before, self.after(), stat(), stat(), 10, 100)
        self.assertEqual((sec, top), (0.0, []))

    def test_ours_and_kthreads_do_not_count(self):
        a = self.after(p10={"utime": 200}, p11={"utime": 150}, p2={"stime": 40})
        sec, _ = procs.foreign_cpu(self.before, a, stat(), stat(user=200, system=40), 10, 100)
        self.assertEqual(sec, 0.0)

    def test_a_stranger_counts_by_name(self):
        a = self.after(p30={"utime": 60})
        sec, top = procs.foreign_cpu(self.before, a, stat(), stat(user=50), 10, 100)
        self.assertAlmostEqual(sec, 0.5)
        self.assertEqual(top, [("cargo", 0.5)])

    def test_reaped_child_time_is_not_charged_at_once(self):
        # bash reaps a child that ran for 20 s before the window: cutime jumps,
        # /proc/stat shows only the 0.1 s it used inside.
        a = self.after(p40={"cutime": 2000})
        sec, _ = procs.foreign_cpu(self.before, a, stat(), stat(user=10), 10, 100)
        self.assertAlmostEqual(sec, 0.1)

    def test_short_lived_processes_show_in_the_residual(self):
        sec, top = procs.foreign_cpu(self.before, self.after(), stat(), stat(user=150), 10, 100)
        self.assertAlmostEqual(sec, 1.5)
        self.assertEqual(top, [])

    def test_pid_reuse(self):
        a = self.after(p30={"utime": 3, "starttime": 999})
        sec, _ = procs.foreign_cpu(self.before, a, stat(), stat(), 10, 100)
        self.assertAlmostEqual(sec, 0.03)


if __name__ == "__main__":
    unittest.main()


class ProcCpu(unittest.TestCase):
    def test_own_time_of_the_proxy_processes(self):
        before = {10: st(10, 1, 100, 50, cut=7), 11: st(11, 10, 20), 12: st(12, 1, 5)}
        after = {10: st(10, 1, 130, 60, cut=99), 11: st(11, 10, 25), 12: st(12, 1, 500)}
        # 40 + 5 ticks: not the reaped children's, not another process's.
        self.assertEqual(procs.proc_cpu(before, after, [10, 11]), 45)
        # A pid reused by a new process counts from zero.
        after[11] = st(11, 10, 3, start=2)
        self.assertEqual(procs.proc_cpu(before, after, [10, 11]), 43)
