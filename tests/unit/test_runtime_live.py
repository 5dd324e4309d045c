"""The runtime's part of ``eaglepatch sweep --live``: a lease in the log directory, and the step count that a
batch's marked requests name, pinned through the worker's own adaptive controller.

The fakes here have the shape of sglang's adaptive machinery (sglang/srt/speculative/adaptive_runtime_state.py,
adaptive_spec_params.py): a controller with ``params`` (the policy) and ``_states`` (one built state per step
count), a worker with ``apply_runtime_state(state)``; ``Policy16`` answers per batch size and learns in
``on_verify_complete`` (0.5.16 and later), ``Policy12`` has ``update``/``current_steps`` (0.5.12). The same
protocol against each release's real controller code: tests/real/test_live_releases.py.
"""
import json
import os
import time

import pytest

from runtime_helpers import Obj, records

TOKEN = "0123456789abcdef"


class State(object):
    def __init__(self, steps):
        self.speculative_num_steps, self.speculative_num_draft_tokens = steps, steps + 1


class Policy16(object):
    """0.5.16+: steps by batch size; a verify with nothing accepted moves it to 1."""

    def __init__(self, steps=3):
        self.current, self.fed = steps, 0
        self.candidate_steps = [0, 1, 3, 7]

    def get_steps_for_batch(self, batch_size):
        return self.current

    def on_verify_complete(self, num_correct_drafts_per_req, batch_size):
        self.fed += 1
        if not any(num_correct_drafts_per_req):
            self.current = 1
            return 1
        return None


class Policy12(object):
    """0.5.12: one slot; update() says whether current_steps changed."""

    def __init__(self, steps=3):
        self.current_steps, self.fed = steps, 0
        self.candidate_steps = [1, 3, 7]

    def update(self, num_correct_drafts_per_req):
        self.fed += 1
        if not any(num_correct_drafts_per_req):
            self.current_steps = 1
            return True
        return False


class Controller(object):
    """AdaptiveController's shape: both releases' entry points, calling the policy the way each does."""

    def __init__(self, worker, policy, steps=(0, 1, 3, 7)):
        self.worker, self.params = worker, policy
        self._states = dict((k, State(k)) for k in steps)

    def activate_step_by_batch(self, batch_size):          # 0.5.16+
        target = self.params.get_steps_for_batch(batch_size)
        if target != self.worker.speculative_num_steps:
            self.worker.apply_runtime_state(self._states[target])

    def on_verify_complete(self, drafts, batch_size=0):
        if hasattr(self.params, "update"):                  # 0.5.12
            if self.params.update(drafts):
                self.worker.apply_runtime_state(self._states[self.params.current_steps])
            return
        new = self.params.on_verify_complete(drafts, batch_size)
        if new is not None:
            self.worker.apply_runtime_state(self._states[new])


def worker(rt, policy=None, bs_switch=True):
    """An EAGLEWorkerV2-shaped adaptive worker whose decode cycles call activate_step_by_batch (0.5.16+)."""

    class EAGLEWorkerV2(object):
        def __init__(self):
            self.topk, self.speculative_num_steps, self.speculative_num_draft_tokens = 1, 3, 4
            self.adaptive_controller = Controller(self, policy or Policy16())
            self.switches = []

        @rt.entry
        def forward_batch_generation(self, batch):
            if bs_switch and self.adaptive_controller is not None:
                self.adaptive_controller.activate_step_by_batch(len(batch.reqs))
            rt.begin("draft", "decode")
            rt.end("draft")
            return self.speculative_num_steps

        def apply_runtime_state(self, state):
            if self.speculative_num_steps == state.speculative_num_steps:
                return
            self.switches.append(state.speculative_num_steps)
            self.speculative_num_steps = state.speculative_num_steps
            self.speculative_num_draft_tokens = state.speculative_num_draft_tokens

    return EAGLEWorkerV2()


class Req(object):
    def __init__(self, rid):
        self.rid = rid


def batch(*rids):
    return Obj(reqs=[Req(r) for r in rids])


def marked(steps, n=0):
    return "eaglepatch-%s-s%d-0-%d" % (TOKEN, steps, n)


@pytest.fixture
def live(rt, logs):
    """The runtime with its writer's rounds run here, and helpers to write the lease and look for it."""
    rt._WRITER_THREAD = False
    logs.mkdir(mode=0o700, exist_ok=True)
    name, answer = rt._live_names()

    class Live(object):
        lease = logs / name
        ack = logs / answer

        def write(self, doc=None, **kw):
            doc = doc if doc is not None else dict({"v": 1, "token": TOKEN, "steps": [0, 1, 3, 7],
                                                    "deadline": time.time() + 60}, **kw)
            tmp = logs / ".lease-tmp"
            tmp.write_text(doc if isinstance(doc, str) else json.dumps(doc))
            os.chmod(str(tmp), 0o600)
            os.replace(str(tmp), str(self.lease))

        def poll(self):
            rt._live_next = 0.0
            rt._live_poll()

    return Live()


def leased(rt, live, w=None, **lease):
    """``w`` (default: a fresh adaptive worker) after one unmarked cycle, and a lease (``lease``: fields to change)
    that the writer has read."""
    w = w if w is not None else worker(rt)
    w.forward_batch_generation(batch("user-0"))             # an adaptive worker has run: the writer looks
    live.write(**lease)
    live.poll()
    return w


def test_marked_requests_pin_their_step_count_and_the_record_says_so(rt, logs, live):
    w = leased(rt, live)
    assert rt._stats()["live"] == TOKEN
    assert json.loads(live.ack.read_text()) == {"v": 1, "token": TOKEN, "pid": os.getpid(), "rank": 0}
    assert w.forward_batch_generation(batch(marked(7), marked(7, 1))) == 7
    w.adaptive_controller.on_verify_complete([0, 0], 2)     # what would move sglang's policy to 1: held off
    assert w.forward_batch_generation(batch(marked(7, 2))) == 7
    assert w.forward_batch_generation(batch(marked(0, 3))) == 0
    rt.flush()
    specs = [r["spec"] for r in records(logs)]
    assert specs == [{"steps": 3, "topk": 1, "draft_tokens": 4},
                     {"steps": 7, "topk": 1, "draft_tokens": 8, "pinned": True},
                     {"steps": 7, "topk": 1, "draft_tokens": 8, "pinned": True},
                     {"steps": 0, "topk": 1, "draft_tokens": 1, "pinned": True}]
    assert w.adaptive_controller.params.policy.fed == 0     # the policy learnt nothing from the pinned cycles
    assert w.switches == [7, 0] and rt._stats()["errors"] == 0


def test_the_first_unmarked_cycle_puts_the_policy_back(rt, logs, live):
    w = leased(rt, live)
    policy = w.adaptive_controller.params
    assert w.forward_batch_generation(batch(marked(1))) == 1
    assert rt._stats()["pinned"] == 1
    assert w.forward_batch_generation(batch("user-2")) == 3  # the policy's own choice again, at this cycle
    assert w.adaptive_controller.params is policy and rt._stats()["pinned"] == 0
    w.adaptive_controller.on_verify_complete([0], 1)         # and it learns again
    assert policy.fed == 1 and w.speculative_num_steps == 1


def test_an_unmarked_request_first_does_not_hide_a_marked_one(rt, live):
    w = leased(rt, live)
    assert w.forward_batch_generation(batch("user", marked(1))) == 1


@pytest.mark.parametrize("rid", [
    "eaglepatch-%s-s5-0-0" % TOKEN,                         # not a step count of the lease
    "eaglepatch-%s-s-0-0" % TOKEN,                          # no digits
    "eaglepatch-%s-s100-0-0" % TOKEN,                       # too many
    "eaglepatch-ffffffffffffffff-s1-0-0",                   # another lease's token
    "eaglepatch-%s-s1x" % TOKEN,
])
def test_requests_that_name_no_candidate_of_the_lease_pin_nothing(rt, live, rid):
    w = leased(rt, live)
    assert w.forward_batch_generation(batch(rid)) == 3
    assert rt._stats()["pinned"] == 0 and rt._stats()["errors"] == 0


def test_a_step_count_the_server_built_no_state_for_is_an_error_not_a_pin(rt, live):
    w = worker(rt)
    del w.adaptive_controller._states[7]
    w = leased(rt, live, w)
    assert w.forward_batch_generation(batch(marked(7))) == 3
    assert rt._stats()["pinned"] == 0 and rt._stats()["errors"] == 1


def test_marked_requests_without_a_lease_pin_nothing(rt, live):
    w = worker(rt)
    w.forward_batch_generation(batch("x"))
    live.poll()                                             # no lease file
    assert w.forward_batch_generation(batch(marked(1))) == 3
    assert rt._stats()["live"] is None and not live.ack.exists()


def test_the_lease_gone_the_writer_forgets_it_and_the_next_cycle_hands_back(rt, live):
    w = leased(rt, live)
    w.forward_batch_generation(batch(marked(7)))
    live.lease.unlink()
    live.poll()
    assert rt._stats()["live"] is None and not live.ack.exists()
    assert rt._stats()["pinned"] == 1                       # until the worker's next cycle...
    assert w.forward_batch_generation(batch(marked(7))) == 3  # ...which hands back, even to a marked request
    assert rt._stats()["pinned"] == 0


def test_past_its_deadline_a_lease_no_longer_pins_even_with_a_stuck_writer(rt, live, monkeypatch):
    """The worker thread checks the deadline itself: a writer stuck in a write cannot keep the state pinned."""
    w = leased(rt, live, deadline=time.time() + 30)
    assert w.forward_batch_generation(batch(marked(1))) == 1
    later = time.time() + 31
    monkeypatch.setattr(rt, "_wall", lambda: later)
    assert w.forward_batch_generation(batch(marked(1))) == 3
    assert rt._stats()["pinned"] == 0
    live.poll()                                             # and the writer forgets it
    assert rt._stats()["live"] is None and not live.ack.exists()


def test_a_renewed_lease_is_kept_without_a_new_answer(rt, live):
    w = leased(rt, live)
    os.utime(str(live.ack), (1, 1))
    live.write(deadline=time.time() + 120)
    live.poll()
    assert os.stat(str(live.ack)).st_mtime == 1
    assert rt._live[2] > time.time() + 100


@pytest.mark.parametrize("doc", [
    {"v": 2, "token": TOKEN, "steps": [1], "deadline": 4e9},
    {"v": 1, "token": "short", "steps": [1], "deadline": 4e9},
    {"v": 1, "token": "0123456789ABCDEF", "steps": [1], "deadline": 4e9},
    {"v": 1, "token": TOKEN, "steps": [], "deadline": 4e9},
    {"v": 1, "token": TOKEN, "steps": [1, "3"], "deadline": 4e9},
    {"v": 1, "token": TOKEN, "steps": [1, 65], "deadline": 4e9},
    {"v": 1, "token": TOKEN, "steps": [True], "deadline": 4e9},
    {"v": 1, "token": TOKEN, "steps": [1], "deadline": 1.0},
    {"v": 1, "token": TOKEN, "steps": [1], "deadline": "4e9"},
    [1, 2],
])
def test_a_document_that_is_not_a_current_lease_is_not_one(rt, doc):
    assert rt._lease_of(doc) is None


def test_a_lease_holds_a_prefix_the_steps_and_the_deadline(rt):
    assert rt._lease_of({"v": 1, "token": TOKEN, "steps": [3, 0, 7], "deadline": 4e9}) == (
        "eaglepatch-%s-s" % TOKEN, frozenset([0, 3, 7]), 4e9, TOKEN)


def _group_writable(live, logs):
    live.write()
    os.chmod(str(live.lease), 0o620)


def _a_link(live, logs):
    (logs / "elsewhere.json").write_text(json.dumps({"v": 1, "token": TOKEN, "steps": [1], "deadline": 4e9}))
    os.symlink(str(logs / "elsewhere.json"), str(live.lease))


def _too_big(live, logs):
    live.write(pad="x" * 5000)


def _not_json(live, logs):
    live.write("{not json")


def _a_fifo(live, logs):
    os.mkfifo(str(live.lease), 0o600)


def _dir_open_to_all(live, logs):
    live.write()
    os.chmod(str(logs), 0o777)


@pytest.mark.parametrize("spoil", [_group_writable, _a_link, _too_big, _not_json, _a_fifo, _dir_open_to_all])
def test_a_lease_file_that_is_not_safe_is_not_followed_and_said_once(rt, logs, live, spoil, capfd):
    w = worker(rt)
    w.forward_batch_generation(batch("x"))
    spoil(live, logs)
    live.poll()
    live.poll()
    assert rt._stats()["live"] is None and not live.ack.exists()
    assert w.forward_batch_generation(batch(marked(1))) == 3
    err = capfd.readouterr().err
    assert err.count("not following the live sweep lease") == 1, err
    os.chmod(str(logs), 0o700)


def test_a_lease_of_another_user_is_not_followed(rt, live):
    w = worker(rt)
    w.forward_batch_generation(batch("x"))
    live.write()
    rt._EUID = os.geteuid() + 1                             # the directory and the file are not "ours" now
    live.poll()
    assert rt._stats()["live"] is None


def test_a_server_that_is_not_adaptive_never_looks_for_a_lease(rt, live):
    w = worker(rt)
    w.adaptive_controller = None                            # EAGLEWorkerV2 without --speculative-adaptive
    w.forward_batch_generation(batch("x"))
    assert rt._live_watch is False
    live.write()
    rt._service()
    assert rt._stats()["live"] is None and not live.ack.exists()


def test_the_writer_looks_for_the_lease_on_its_own(load, logs):
    """With the writer thread: it wakes at least every _LIVE_POLL_SECONDS once an adaptive worker has run, and
    answers a lease without any cycle or flush."""
    rt = load()
    w = worker(rt)
    w.forward_batch_generation(batch("x"))
    logs.mkdir(mode=0o700, exist_ok=True)
    name, answer = rt._live_names()
    (logs / ".t").write_text(json.dumps({"v": 1, "token": TOKEN, "steps": [1], "deadline": time.time() + 60}))
    os.chmod(str(logs / ".t"), 0o600)
    os.replace(str(logs / ".t"), str(logs / name))
    deadline = time.monotonic() + 10
    while not (logs / answer).exists():
        assert time.monotonic() < deadline, "the writer never answered the lease"
        time.sleep(0.05)
    assert rt._stats()["live"] == TOKEN


def test_a_0_5_12_policy_is_held_off_and_its_own_state_comes_back(rt, live):
    """0.5.12 switches only when its average moves (no activate_step_by_batch): on hand-back the runtime applies
    the policy's current_steps itself."""
    w = leased(rt, live, worker(rt, policy=Policy12(), bs_switch=False), steps=[1, 3, 7])
    policy = w.adaptive_controller.params
    assert w.forward_batch_generation(batch(marked(7))) == 7
    w.adaptive_controller.on_verify_complete([0])           # update() answers False while pinned
    assert policy.fed == 0 and w.speculative_num_steps == 7
    assert w.forward_batch_generation(batch("user")) == 3
    assert w.adaptive_controller.params is policy


def test_nested_calls_are_pinned_once_by_the_outer_one(rt, live):
    class Sub(type(worker(rt))):
        @rt.entry
        def forward_batch_generation(self, batch):
            return super(Sub, self).forward_batch_generation(batch)

    w = leased(rt, live, Sub())
    assert w.forward_batch_generation(batch(marked(1))) == 1
    assert w.switches == [1]


def test_a_failing_switch_leaves_the_policy_in_charge(rt, live):
    w = leased(rt, live)

    def boom(state):
        raise RuntimeError("cannot switch")

    w.apply_runtime_state = boom
    assert w.forward_batch_generation(batch(marked(7))) == 3  # the server goes on, as sglang chose
    assert rt._stats()["pinned"] == 0 and rt._stats()["errors"] == 1
    assert type(w.adaptive_controller.params) is Policy16


def test_after_a_fork_the_child_holds_no_lease(rt, live):
    w = leased(rt, live)
    w.forward_batch_generation(batch(marked(1)))
    rt._after_fork_child()
    assert (rt._live, rt._pins, rt._live_watch) == (None, {}, False)
