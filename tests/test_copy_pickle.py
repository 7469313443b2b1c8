"""Copying and pickling what holds native state (pools, executable memory, models) is refused or
returns the object itself; errors and packings survive pickling; results are not aliased."""
import copy
import pickle

import numpy as np
import pytest

import tppasm as tpp
from tests.scripts import run


# -- native state: the object itself, or a TypeError --------------------------------------------

def test_pool_copies_are_the_pool_and_pickling_it_is_refused():
    from isa.pool import Pool
    pool = Pool(1)
    try:
        assert copy.copy(pool) is pool and copy.deepcopy(pool) is pool
        with pytest.raises(TypeError, match=r"this process's threads.*Pool\(1\)"):
            pickle.dumps(pool)
    finally:
        pool.close()


def test_a_pool_copy_outlives_the_original_without_a_crash():
    # before the fix the copy shared the original's state, unmapped when the original was collected
    out = run("""
        import copy, ctypes, gc
        from isa.pool import Pool
        from isa.x86 import Function, qword
        f = Function("count", ["ptr", "i64", "i64"]); counts, tid, _ = f.args
        f.asm.inc(qword[counts + tid * 8]); count = f.finalize()
        p = Pool(2); q = copy.copy(p); del p; gc.collect()
        hits = (ctypes.c_int64 * 2)()
        q.run(count.address, ctypes.addressof(hits))
        print(list(hits) == [1, 1])
        """, timeout=60)
    assert out.split()[-1] == "True"


def test_executable_memory_copies_are_itself_and_pickling_it_is_refused():
    from isa.memory import ExecutableMemory
    mem = ExecutableMemory(b"\xc3")
    assert copy.copy(mem) is mem and copy.deepcopy(mem) is mem
    with pytest.raises(TypeError, match="bound to this process"):
        pickle.dumps(mem)


def test_a_jit_function_pickles_with_a_type_error_naming_the_fix():
    import tppasm as tpp
    with pytest.raises(TypeError, match="bound to this process.*pickle the kernel"):
        pickle.dumps(tpp.relu(8, 8).raw)


def test_a_deep_copied_jit_function_keeps_its_code_mapped():
    # before the fix the copy's memory was a stranger's address: calling it once the original was
    # collected jumped into unmapped pages (SIGSEGV)
    out = run("""
        import copy, gc
        import numpy as np
        from isa.x86 import Function, ymm0, ymm1
        fn = Function("axpy8", ["ptr", "ptr", "f32"]); x, y, alpha = fn.args
        fn.asm.vbroadcastss(ymm1, alpha); fn.asm.vmovups(ymm0, [x]); fn.asm.vfmadd213ps(ymm0, ymm1, [y])
        fn.asm.vmovups([y], ymm0)
        f = fn.finalize(); g = copy.deepcopy(f); del f; gc.collect()
        X = np.arange(8, dtype=np.float32); Y = np.ones(8, np.float32)
        g(X.ctypes.data, Y.ctypes.data, 2.0)
        print(g.memory.alive, Y.tolist() == (2 * X + 1).tolist())
        """, timeout=60)
    assert out.split()[-2:] == ["True", "True"]


@pytest.mark.parametrize("how", [copy.copy, copy.deepcopy, pickle.dumps])
def test_a_llama_layer_is_not_copied_but_built_again(how):
    from bench.models.llama import LlamaLayer
    from bench.models.llama_weights import Config, random_weights
    layer = LlamaLayer(Config.small(), random_weights(Config.small()), "bf16")
    with pytest.raises(TypeError, match=r"LlamaLayer\(cfg, weights"):
        how(layer)


@pytest.mark.parametrize("how", [copy.copy, copy.deepcopy, pickle.dumps])
def test_a_minilm_is_not_copied_but_loaded_again(how):
    from bench.models.minilm import MiniLM
    model = MiniLM.__new__(MiniLM)          # (loading the checkpoint is not what is tested)
    with pytest.raises(TypeError, match=r"MiniLM\.load\("):
        how(model)


# -- values that must survive pickling -------------------------------------------------------------

def test_cache_errors_survive_pickling():
    from tppasm.cache.trust import ForeignFile, LockTimeout, NotTheStores, UnsafeDirectory
    for error in (NotTheStores("/d", "index.json"), ForeignFile("/d/lock", 0), UnsafeDirectory(1, "bad"),
                  LockTimeout(11, "held")):
        back = pickle.loads(pickle.dumps(error))
        assert type(back) is type(error) and str(back) == str(error) and back.errno == error.errno
        assert back.__dict__ == error.__dict__


def test_tuned_results_compare_by_identity():
    from loops.tune import Tuned
    found = Tuned({"kernel": "k", "spec": "aB"}, arrays=(np.zeros(3), np.ones(3)))
    assert found == found and found != copy.deepcopy(found)       # (was NumPy's ambiguous truth value)


@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
def test_a_packed_weight_pickles_at_every_protocol(protocol):
    from tppasm import fc
    rng = np.random.default_rng(0)
    w, x = rng.standard_normal((96, 64), np.float32), rng.standard_normal((8, 64), np.float32)
    packed = fc.pack(w)
    back = pickle.loads(pickle.dumps(packed, protocol=protocol))
    assert np.array_equal(fc.forward(x, back)[0], fc.forward(x, packed)[0])


def test_a_packing_cut_under_another_plan_says_to_pack_again(monkeypatch):
    from tppasm import fc
    w, x = np.ones((1536, 384), np.float32), np.ones((64, 384), np.float32)
    monkeypatch.setattr(fc, "PACKED_PANEL_BYTES", 128 << 10)
    stale = fc.pack(w)
    monkeypatch.undo()
    assert fc.pack(w).panels.keys() != stale.panels.keys()
    with pytest.raises(ValueError, match=r"pack the weight again: fc\.pack\(p\.w\)"):
        fc.forward(x, stale)


# -- results that must not be aliased --------------------------------------------------------------

def test_recalled_records_are_copies(tmp_path):
    import tppasm.cache as tc
    with tc.using(tmp_path):
        tc.remember("demo", "key", {"spec": "aBC", "knobs": {"bm": 8}})
        for _ in range(2):                      # pending in this process, then read from the index
            tc.recall("demo", "key")["knobs"]["bm"] = 99
            tc.records("demo")[0][1]["spec"] = "mutated"
            assert tc.recall("demo", "key") == {"spec": "aBC", "knobs": {"bm": 8}}
            assert tc.records("demo") == [("demo", {"spec": "aBC", "knobs": {"bm": 8}})]
            tc.flush()


def test_block_spmm_gives_one_kernel_object_for_equal_arguments():
    import tppasm as tpp
    s = tpp.block_spmm(bm=2, bk=2, n=8, kb=2)
    assert s is tpp.block_spmm(bm=2, bk=2, n=8, kb=2)
    assert copy.copy(s) is s and copy.deepcopy(s) is s and pickle.loads(pickle.dumps(s)) is s


def test_a_called_jit_function_copies_as_itself():
    # once called, its ctypes function (holding a pointer) made deepcopy fail with ctypes' ValueError
    from isa.x86 import Function, eax
    fn = Function("seven", [], "i32"); fn.asm.mov(eax, 7)
    f = fn.finalize()
    assert f() == 7
    assert copy.copy(f) is f and copy.deepcopy(f) is f
    with pytest.raises(TypeError, match="bound to this process"):
        pickle.dumps(f)


def test_an_offset_batched_brgemm_is_one_object_for_equal_arguments():
    k = tpp.brgemm(2, 3, 4, batch="offset")
    assert k is tpp.brgemm(2, 3, 4, batch="offset") is copy.copy(k) is copy.deepcopy(k)
    assert pickle.loads(pickle.dumps(k)) is k


def test_concurrent_first_calls_share_one_wrapper():
    import sys
    import threading
    from tppasm.lazy import one_wrapper

    class Kernel:
        pass

    class Slow:
        def __init__(self, kernel):
            import time
            time.sleep(0.001)               # (widens the window between the read and the write)

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        for _ in range(20):
            k, got = Kernel(), []
            threads = [threading.Thread(target=lambda: got.append(one_wrapper(k, Slow))) for _ in range(4)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            assert len({id(w) for w in got}) == 1
    finally:
        sys.setswitchinterval(old)
