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

from runtime_helpers import Obj, open_calls, records

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
    """An EAGLEWorkerV2-shaped adaptive worker whose decode cycles call activate_step_by_batch (0.5.16+), behind
    sglang's own guard (eagle_worker_v2.py, every release: ``if batch.forward_mode.is_extend() or
    batch.is_extend_in_batch:`` prefill, else decode)."""

    class EAGLEWorkerV2(object):
        def __init__(self):
            self.topk, self.speculative_num_steps, self.speculative_num_draft_tokens = 1, 3, 4
            self.adaptive_controller = Controller(self, policy or Policy16())
            self.switches = []

        @rt.entry
        def forward_batch_generation(self, batch):
            if bs_switch and self.adaptive_controller is not None and not (
                    batch.forward_mode.is_extend() or batch.is_extend_in_batch):
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


class Mode(object):
    """sglang's ForwardMode as the entry method asks it (model_executor/forward_batch_info.py)."""

    def __init__(self, extend):
        self.extend = extend

    def is_extend(self):
        return self.extend


def batch(*rids, **kw):
    """A decode batch of requests ``rids``; ``mode="prefill"``: an extend batch, ``mode="mixed"``: a decode batch
    that DP attention runs as extend (``is_extend_in_batch``), as sglang's ScheduleBatch carries them."""
    mode = kw.pop("mode", "decode")
    return Obj(reqs=[Req(r) for r in rids], forward_mode=Mode(mode == "prefill"), is_extend_in_batch=mode != "decode",
               **kw)


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
    w = leased(rt, live, shared=True)           # --allow-shared-traffic: a batch with others' requests is pinned
    assert w.forward_batch_generation(batch("user", marked(1))) == 1


def test_a_batch_with_others_requests_is_not_pinned_without_shared(rt, live):
    w = leased(rt, live)
    assert w.forward_batch_generation(batch("user", marked(1))) == 3     # sglang's own choice: not pinned
    assert rt._stats()["pinned"] == 0
    assert w.forward_batch_generation(batch(marked(1, 1))) == 1         # the sweep's requests alone: pinned


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
    assert rt._live[2] > time.time() + 100 and rt._stats()["errors"] == 0


def test_a_new_lease_in_place_of_the_held_one_is_answered_anew(rt, live):
    w = leased(rt, live)
    live.write(token="fedcba9876543210")
    live.poll()
    assert json.loads(live.ack.read_text())["token"] == "fedcba9876543210"
    assert rt._stats()["live"] == "fedcba9876543210" and rt._stats()["errors"] == 0
    assert w.forward_batch_generation(batch(marked(7))) == 3   # the old token's requests no longer pin


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


@pytest.mark.parametrize("spoil, why", [
    (_group_writable, "(LEASE is not a small regular file of uid %d, writable by it alone)" % os.geteuid()),
    (_a_link, "(LEASE is a link or not a regular file)"),
    (_too_big, "is not a small regular file of uid"),
    (_not_json, "Expecting property name"),
    (_a_fifo, "is not a small regular file of uid"),
    (_dir_open_to_all, "writable by group or others"),
])
def test_a_lease_file_that_is_not_safe_is_not_followed_and_said_once(rt, logs, live, spoil, why, capfd):
    w = worker(rt)
    w.forward_batch_generation(batch("x"))
    spoil(live, logs)
    live.poll()
    live.poll()
    assert rt._stats()["live"] is None and not live.ack.exists()
    assert w.forward_batch_generation(batch(marked(1))) == 3
    err = capfd.readouterr().err
    assert err.count("not following the live sweep lease") == 1, err
    assert err.startswith("[eaglepatch] not following the live sweep lease %s in %s (" % (live.lease.name, logs)), err
    assert err.endswith("): sglang's own adaptive policy stays in charge\n"), err
    assert why.replace("LEASE", live.lease.name) in err, err
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


# --- the fifth mutation round (docs/mutation-runtime.md): what the tests above left unsaid ---------------------

def test_the_pinned_policy_answers_as_sglangs_policy_does(rt):
    """_Pinned stands where sglang's controller reads its policy: 0.5.12 reads ``current_steps`` (an int) after
    ``update()`` says it changed, 0.5.16+ reads ``on_verify_complete()``'s new step count (None: no switch); all
    else (``candidate_steps``, ``cuda_graph_bs_for_step``) is the policy's own."""
    policy = Policy12(steps=3)
    pinned = rt._Pinned(policy, 7)
    assert pinned.current_steps == 7 and type(pinned.current_steps) is int
    assert pinned.update([0, 0]) is False and pinned.on_verify_complete([0, 0], 2) is None
    assert pinned.get_steps_for_batch(4) == 7
    assert pinned.candidate_steps is policy.candidate_steps and policy.fed == 0
    with pytest.raises(AttributeError):
        pinned.no_such_attribute


def test_step_counts_of_two_digits_are_pinned(rt, live):
    w = worker(rt)
    w.adaptive_controller._states[12] = State(12)
    w = leased(rt, live, w, steps=[1, 12])
    assert w.forward_batch_generation(batch(marked(12))) == 12
    assert rt._stats()["errors"] == 0


def test_handing_back_reports_no_error(rt, live):
    """The lease gone: the next cycle hands back quietly (an error here would count in every summary)."""
    w = leased(rt, live)
    w.forward_batch_generation(batch(marked(7)))
    live.lease.unlink()
    live.poll()
    assert w.forward_batch_generation(batch("user")) == 3
    assert rt._stats()["errors"] == 0 and rt._stats()["pinned"] == 0


def test_a_lease_holds_until_its_deadline_not_at_it(rt, live, monkeypatch):
    deadline = time.time() + 30
    w = leased(rt, live, deadline=deadline)
    monkeypatch.setattr(rt, "_wall", lambda: deadline - 0.001)
    assert w.forward_batch_generation(batch(marked(1))) == 1
    monkeypatch.setattr(rt, "_wall", lambda: deadline)
    assert w.forward_batch_generation(batch(marked(1))) == 3


def test_a_pin_is_kept_by_its_controller(rt, live):
    """By reference: the key is the controller's id, which no other object can take while it is held."""
    w = leased(rt, live)
    w.forward_batch_generation(batch(marked(7)))
    assert list(rt._pins.values()) == [w.adaptive_controller]


def test_a_failing_switch_is_reported_as_the_live_sweeps(rt, live, capfd):
    w = leased(rt, live)

    def boom(state):
        raise RuntimeError("cannot switch")

    w.apply_runtime_state = boom
    w.forward_batch_generation(batch(marked(7)))
    rt.flush()
    err = capfd.readouterr().err
    assert "[eaglepatch] internal error in live (" in err and "cannot switch" in err, err


def test_handing_back_applies_the_policys_choice_for_the_batch(rt, live):
    """0.5.16+: the policy's step count for this batch's size, applied by the runtime itself (a worker whose
    cycle does not switch by batch size would otherwise stay at the pinned state)."""

    class BySize(Policy16):
        def get_steps_for_batch(self, batch_size):
            return {1: 1, 2: 7}.get(batch_size, 3)

    w = leased(rt, live, worker(rt, policy=BySize(), bs_switch=False))
    assert w.forward_batch_generation(batch(marked(0))) == 0
    assert w.forward_batch_generation(batch("user-a", "user-b")) == 7
    assert w.forward_batch_generation(batch(marked(0))) == 0
    assert w.forward_batch_generation(batch("user-c")) == 1


def test_a_pinned_state_already_running_is_not_applied_again(rt, live):
    w = leased(rt, live)
    applied = []
    real = w.apply_runtime_state

    def counting(state):
        applied.append(state.speculative_num_steps)
        real(state)

    w.apply_runtime_state = counting
    w.forward_batch_generation(batch(marked(7)))
    w.forward_batch_generation(batch(marked(7)))
    w.forward_batch_generation(batch("user"))               # back to the policy's 3
    w.forward_batch_generation(batch("user"))
    w.forward_batch_generation(batch(marked(3)))            # pinned where the worker runs already
    w.forward_batch_generation(batch("user"))               # and handed back where the policy wants it
    assert applied == [7, 3] and rt._stats()["pinned"] == 0


def test_the_writers_wait_ends_at_its_next_look(rt):
    rt._live_next = 10.0
    assert rt._live_wait(None, 9.75) == 0.25
    assert rt._live_wait(0.1, 9.75) == 0.1
    assert rt._live_wait(5.0, 9.75) == 0.25
    assert rt._live_wait(None, 12.0) == 0.0                  # overdue: look now


def test_the_writer_looks_every_half_second(rt, live, monkeypatch):
    """_LIVE_POLL_SECONDS as shipped (docs/design.md): a lease written after a look is seen 0.5 s later, not
    before."""
    w = worker(rt)
    w.forward_batch_generation(batch("x"))
    now = [100.0]
    monkeypatch.setattr(rt, "_mono", lambda: now[0])
    rt._live_next = 0.0
    rt._live_poll()                                         # a look: no lease yet
    live.write()
    now[0] = 100.49
    rt._live_poll()
    assert rt._stats()["live"] is None
    now[0] = 100.5
    rt._live_poll()
    assert rt._stats()["live"] == TOKEN


def test_the_lease_and_answer_files_are_named_as_the_client_reads_them(rt, live):
    """The protocol's names (the runtime's docstring; eaglepatch/hostside/live.py reads the answers):
    ``live-<launcher pid>.json`` and ``live-<launcher pid>-<pid>.ack``."""
    from eaglepatch.hostside.live import _LIVE_ACK
    launcher = rt._run_of()[1]["launcher"]
    assert live.lease.name == "live-%d.json" % launcher
    assert live.ack.name == "live-%d-%d.ack" % (launcher, os.getpid())
    assert _LIVE_ACK.match(live.ack.name).groups() == (str(launcher), str(os.getpid()))


def test_a_lease_file_of_exactly_the_size_limit_is_read(rt, live):
    w = worker(rt)
    w.forward_batch_generation(batch("x"))
    doc = json.dumps({"v": 1, "token": TOKEN, "steps": [1], "deadline": time.time() + 60, "pad": ""})
    live.write(doc[:-2] + "x" * (rt._LIVE_MAX_BYTES - len(doc)) + '"}')
    assert os.path.getsize(str(live.lease)) == rt._LIVE_MAX_BYTES == 4096
    live.poll()
    assert rt._stats()["live"] == TOKEN


@pytest.mark.parametrize("token", ["01234567", "0" * 64])
def test_tokens_of_8_to_64_hex_digits_are_leases(rt, token):
    assert rt._lease_of({"v": 1, "token": token, "steps": [1], "deadline": 4e9})[3] == token


@pytest.mark.parametrize("token", ["0123456", "0" * 65, "0123456789abcdeX", 12345678901234567])
def test_other_tokens_are_not(rt, token):
    assert rt._lease_of({"v": 1, "token": token, "steps": [1], "deadline": 4e9}) is None


def test_a_lease_may_name_64_step_counts_up_to_64(rt):
    steps = list(range(1, 65))
    assert rt._lease_of({"v": 1, "token": TOKEN, "steps": steps, "deadline": 4e9})[1] == frozenset(steps)
    assert rt._lease_of({"v": 1, "token": TOKEN, "steps": steps + [0], "deadline": 4e9}) is None


def test_the_lease_and_the_answer_are_opened_with_exactly_the_safe_flags(rt, live, logs):
    """As the log file: close-on-exec, no link followed, never blocking (a FIFO planted at either name); the answer
    created 0600."""
    w = worker(rt)
    w.forward_batch_generation(batch("x"))
    live.write()
    calls = open_calls(live.poll)
    safe = os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
    directory = (str(logs), os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    assert calls == [
        directory, (live.lease.name, os.O_RDONLY | safe, "dir_fd"),
        directory, (live.ack.name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | safe, 0o600, "dir_fd"),
    ]
    assert rt._stats()["live"] == TOKEN


def test_a_lease_is_no_longer_one_at_its_deadline(rt, monkeypatch):
    monkeypatch.setattr(rt, "_wall", lambda: 1000.0)
    assert rt._lease_of({"v": 1, "token": TOKEN, "steps": [1], "deadline": 1000.001}) is not None
    assert rt._lease_of({"v": 1, "token": TOKEN, "steps": [1], "deadline": 1000.0}) is None


def test_a_lease_that_others_may_read_or_run_is_followed(rt, live):
    """Only a write bit of group or others makes a lease unsafe (0o022), not read or execute bits."""
    w = worker(rt)
    w.forward_batch_generation(batch("x"))
    live.write()
    os.chmod(str(live.lease), 0o755)
    live.poll()
    assert rt._stats()["live"] == TOKEN


def test_an_answer_that_cannot_be_a_file_is_an_error_and_nothing_is_written_into_it(rt, live, capfd):
    """A FIFO with a reader planted at the answer's name opens without blocking: the fstat after the open refuses
    it, nothing is written to the reader, and the error is the live sweep's."""
    w = worker(rt)
    w.forward_batch_generation(batch("x"))
    os.mkfifo(str(live.ack), 0o600)
    reader = os.open(str(live.ack), os.O_RDONLY | os.O_NONBLOCK)
    try:
        live.write()
        live.poll()
        rt.flush()
        assert os.read(reader, 4096) == b""
    finally:
        os.close(reader)
    assert rt._stats()["errors"] == 1
    err = capfd.readouterr().err
    assert "[eaglepatch] internal error in live (" in err, err
    assert "_Unsafe: %s is not a regular file\n" % live.ack.name in err, err


# --- issue 41: a pin switches state on decode batches only, and a failed switch leaves the previous state whole ---

def watched(rt, **kw):
    """``worker(rt)`` whose ``calls`` lists, per entry call, (the batch's mode, steps at the call's start as the
    entry method's body saw them, steps after): the runtime's own switch happens before the body runs."""
    w = worker(rt, **kw)
    cls = type(w)
    inner = cls.forward_batch_generation.__wrapped__
    w.calls = []

    def body(self, b):
        before = self.speculative_num_steps
        out = inner(self, b)
        mode = "prefill" if b.forward_mode.is_extend() else "mixed" if b.is_extend_in_batch else "decode"
        self.calls.append((mode, before, self.speculative_num_steps))
        return out

    cls.forward_batch_generation = rt.entry(body)
    return w


def test_prefill_and_extend_calls_never_switch_and_decode_calls_do(rt, logs, live):
    """A window's request arrives as a prefill (extend) call first: it runs in the state the worker is in; its
    first decode call switches. A mixed batch (DP attention's is_extend_in_batch) is sglang's prefill path too."""
    w = leased(rt, live, watched(rt))
    w.calls[:] = []
    w.forward_batch_generation(batch(marked(7), mode="prefill"))
    w.forward_batch_generation(batch(marked(7)))
    w.forward_batch_generation(batch(marked(1), mode="mixed"))
    w.forward_batch_generation(batch(marked(1), mode="prefill"))
    w.forward_batch_generation(batch(marked(1)))
    w.forward_batch_generation(batch(marked(1)))
    assert w.calls == [("prefill", 3, 3), ("decode", 7, 7), ("mixed", 7, 7), ("prefill", 7, 7), ("decode", 1, 1),
                       ("decode", 1, 1)]
    assert w.switches == [7, 1] and rt._stats()["errors"] == 0
    # a record says pinned only where the cycle ran at the steps its requests name: not the next window's prefills
    rt.flush()
    assert [(r["spec"]["steps"], r["spec"].get("pinned", False)) for r in records(logs)][1:] == [
        (3, False), (7, True), (7, False), (7, False), (1, True), (1, True)]


def test_a_prefill_hands_the_policy_back_but_the_state_waits_for_the_next_decode_batch(rt, logs, live):
    """The sweep over, an unmarked prefill gives sglang its policy back (sglang asks it on decode batches only, and
    the record of that prefill must not say pinned) without touching the state; the next decode batch runs in the
    policy's choice (here by the runtime: a worker that does not switch by batch size)."""
    w = leased(rt, live, watched(rt, bs_switch=False))
    policy = w.adaptive_controller.params
    w.forward_batch_generation(batch(marked(7)))
    w.calls[:] = []
    w.forward_batch_generation(batch("user-1", mode="prefill"))
    assert w.adaptive_controller.params is policy and w.speculative_num_steps == 7
    w.forward_batch_generation(batch("user-1"))
    assert w.calls == [("prefill", 7, 7), ("decode", 3, 3)] and w.switches == [7, 3]
    assert rt._stats()["pinned"] == 0 and rt._stats()["errors"] == 0
    rt.flush()
    assert [r["spec"].get("pinned", False) for r in records(logs)][-3:] == [True, False, False]


@pytest.mark.parametrize("spoil", [
    lambda b: delattr(b, "forward_mode"),
    lambda b: delattr(b, "is_extend_in_batch"),
    lambda b: setattr(b.forward_mode, "is_extend", lambda: "no"),      # not sglang's bool
    lambda b: setattr(b, "is_extend_in_batch", None),
], ids=["no-forward-mode", "no-is-extend-in-batch", "is-extend-not-bool", "in-batch-not-bool"])
def test_a_batch_whose_mode_cannot_be_read_switches_nothing_and_is_counted(rt, live, spoil, capfd):
    """A batch sglang's guard could not read either (a release the runtime does not know): no pin, no switch, each
    such cycle counted, the first said."""
    w = leased(rt, live, worker(rt, bs_switch=False))
    for n in range(3):
        b = batch(marked(7))
        spoil(b)
        assert w.forward_batch_generation(b) == 3
    assert w.switches == [] and type(w.adaptive_controller.params) is Policy16
    assert rt._stats()["errors"] == 3 and rt._stats()["pinned"] == 0
    rt.flush()
    err = capfd.readouterr().err
    assert err.count("[eaglepatch] internal error in live mode (") == 1, err


class Runner(object):
    """A model runner the switch sets attributes on (the draft runner, the target's model runner)."""


def two_sided(rt, fail_at=None, **kw):
    """``watched(rt)`` whose apply_runtime_state sets attributes on itself, its draft worker and that one's runner, as
    sglang's EAGLEWorkerV2.apply_runtime_state does, raising at its ``fail_at``-th attribute (1 = the first)."""
    w = watched(rt, **kw)
    w._draft_worker = Obj(speculative_num_steps=3, draft_attn_backend="attn@3", draft_runner=Runner())
    w._draft_worker.draft_runner.attn_backend = "extend@3"
    w.fail_at = fail_at

    def apply(state):
        if w.speculative_num_steps == state.speculative_num_steps:
            return
        sets = [(w, "speculative_num_steps", state.speculative_num_steps),
                (w, "speculative_num_draft_tokens", state.speculative_num_draft_tokens),
                (w._draft_worker, "speculative_num_steps", state.speculative_num_steps),
                (w._draft_worker, "draft_attn_backend", "attn@%d" % state.speculative_num_steps),
                (w._draft_worker, "topk1_parents", object()),                      # added by the switch
                (w._draft_worker.draft_runner, "attn_backend", "extend@%d" % state.speculative_num_steps)]
        for n, (obj, name, value) in enumerate(sets, 1):
            if n == w.fail_at:
                raise RuntimeError("CUDA out of memory (injected at set %d)" % n)
            setattr(obj, name, value)
        w.switches.append(state.speculative_num_steps)

    w.apply_runtime_state = apply
    return w


def picture(w):
    """Everything a switch may have touched, by identity."""
    dw = w._draft_worker
    ctl = w.adaptive_controller
    pol = ctl.params
    return ([(k, id(v)) for k, v in sorted(vars(w).items()) if k not in ("calls", "fail_at")],
            [(k, id(v)) for k, v in sorted(vars(dw).items())],
            [(k, id(v)) for k, v in sorted(vars(dw.draft_runner).items())],
            id(pol), getattr(pol, "steps", None))


@pytest.mark.parametrize("fail_at", range(1, 7))
@pytest.mark.parametrize("held", [False, True], ids=["from-sglangs-policy", "from-a-pin"])
def test_a_switch_that_fails_half_way_leaves_the_previous_state_whole(rt, live, capfd, fail_at, held):
    """Whichever attribute the switch fails at, every one it set is put back, its policy too (sglang's, or the pin
    it held); the cycle runs in the previous state, the error is the live sweep's, said once; a later decode cycle
    switches when the switch works again."""
    w = leased(rt, live, two_sided(rt))
    if held:
        w.forward_batch_generation(batch(marked(1)))
    before = picture(w)
    steps = w.speculative_num_steps
    w.fail_at = fail_at
    w.calls[:] = []
    assert w.forward_batch_generation(batch(marked(7))) == steps
    assert w.forward_batch_generation(batch(marked(7))) == steps
    assert picture(w) == before and w.calls == [("decode", steps, steps)] * 2
    assert rt._stats()["errors"] == 2 and rt._stats()["pinned"] == int(held)
    rt.flush()
    err = capfd.readouterr().err
    assert err.count("[eaglepatch] internal error in live (") == 1 and "injected at set %d" % fail_at in err, err
    w.fail_at = None
    assert w.forward_batch_generation(batch(marked(7))) == 7
    assert (w._draft_worker.speculative_num_steps, w._draft_worker.draft_runner.attn_backend) == (7, "extend@7")


def test_a_hand_back_whose_switch_fails_keeps_sglangs_policy_and_the_previous_state(rt, live):
    w = leased(rt, live, two_sided(rt, bs_switch=False))
    policy = w.adaptive_controller.params
    w.forward_batch_generation(batch(marked(7)))
    before = picture(w)[:3]
    w.fail_at = 4
    assert w.forward_batch_generation(batch("user")) == 7
    assert picture(w)[:3] == before and w.adaptive_controller.params is policy
    assert rt._stats()["errors"] == 1 and rt._stats()["pinned"] == 0
