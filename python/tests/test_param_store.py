"""strata._core.ParamStore: opaque byte units (a module's 16-bit parameters each) in a swap file
under zero_optimization.offload_param.nvme_path (src/offload/param_store.h).

Round trips of odd sizes through aligned (direct) and unaligned (bounce) buffers, two threads at
once, checksum corruption on disk, the config's key and budget errors, argument errors, the usage
counters and the removal of the swap folder at close().
"""
import json
import os
import threading

import pytest

from conftest import require

np = require("numpy")
core = require("strata._core")

ODD_SIZES = [1, 3, 4095, 4096, 4097, 10001, 2 * 33333]  # the last: 33333 bf16 values


def context(nvme_path=None, strata_section=None, stage=2):
    zero = {"stage": stage}
    if nvme_path is not None:
        zero["offload_param"] = {"nvme_path": nvme_path}
    config = {"zero_optimization": zero}
    if strata_section:
        config["strata"] = dict(strata_section)
    return core.Context(json.dumps(config), "test_param_store.json")


def pattern(nbytes, seed):
    return np.random.default_rng(seed).integers(0, 256, nbytes, dtype=np.uint8)


def unaligned(nbytes):
    """A writable uint8 array of nbytes whose data is not 4096-aligned."""
    raw = np.zeros(nbytes + 4096 + 1, np.uint8)
    start = (-raw.ctypes.data) % 4096 + 1
    view = raw[start:start + nbytes]
    assert view.ctypes.data % 4096 == 1
    return view


@pytest.fixture
def swap_dir(tmp_path):
    return str(tmp_path / "nvme")


def test_aligned_buffer():
    for n in [0, 1, 4096, 5000]:
        b = core.aligned_buffer(n)
        assert b.dtype == np.uint8 and b.shape == (n,) and b.flags.c_contiguous
        assert b.ctypes.data % 4096 == 0
        assert not b.any()
    with pytest.raises(core.StrataError, match="nbytes"):
        core.aligned_buffer(-1)


def test_round_trip_odd_sizes_aligned_and_unaligned(swap_dir):
    store = core.ParamStore(context(swap_dir), ODD_SIZES)
    assert store.units() == len(ODD_SIZES)
    assert [store.unit_bytes(u) for u in range(store.units())] == ODD_SIZES
    data = [pattern(n, u) for u, n in enumerate(ODD_SIZES)]
    # Even units from unaligned arrays (bounced), odd units from aligned buffers (direct).
    for u, n in enumerate(ODD_SIZES):
        if u % 2 == 0:
            src = unaligned(n)
        else:
            src = core.aligned_buffer(n)
        src[:] = data[u]
        store.write(u, src)
    # bf16 bit patterns through a uint16 view of an aligned buffer, NaN and infinity included.
    bf16 = np.random.default_rng(7).integers(0, 1 << 16, ODD_SIZES[-1] // 2, dtype=np.uint16)
    bf16[:4] = [0x7FC0, 0x7F80, 0xFF80, 0x8000]  # NaN, +inf, -inf, -0
    last = len(ODD_SIZES) - 1
    src = core.aligned_buffer(ODD_SIZES[-1]).view(np.uint16)
    src[:] = bf16
    store.write(last, src)
    data[last] = bf16.view(np.uint8)
    for u, n in enumerate(ODD_SIZES):
        for out in (core.aligned_buffer(n), unaligned(n), np.zeros(n, np.uint8)):
            store.read(u, out)
            assert np.array_equal(out, data[u]), f"unit {u} ({n} bytes)"
        # A larger array: only the unit's bytes change.
        big = np.full(n + 5000, 0xAB, np.uint8)
        store.read(u, big)
        assert np.array_equal(big[:n], data[u]) and (big[n:] == 0xAB).all()
        big = core.aligned_buffer(n + 5000)
        big[:] = 0xCD
        store.read(u, big)
        assert np.array_equal(big[:n], data[u]) and (big[n:] == 0xCD).all()
    out = core.aligned_buffer(ODD_SIZES[-1]).view(np.uint16)
    store.read(last, out)
    assert np.array_equal(out, bf16)
    # Another dtype of the same bytes.
    out = np.zeros(ODD_SIZES[4], np.uint8)
    store.write(4, data[4].view(np.uint8))
    store.read(4, out)
    assert np.array_equal(out, data[4])
    store.close()


def test_aligned_buffers_go_direct(swap_dir):
    sizes = [4096, 5000, 8192 + 2]
    store = core.ParamStore(context(swap_dir), sizes)
    for u, n in enumerate(sizes):
        src = core.aligned_buffer(n)
        src[:] = pattern(n, u)
        store.write(u, src)
        out = core.aligned_buffer(n)
        store.read(u, out)
        assert np.array_equal(out, src)
    assert store.usage()["bounce_buffers"] == 0
    store.read(1, unaligned(sizes[1]))
    assert store.usage()["bounce_buffers"] == 1
    store.close()


def test_concurrent_read_and_write(swap_dir):
    n_units, size, rounds = 8, 3 * 4096 + 17, 40
    store = core.ParamStore(context(swap_dir), [size] * n_units)
    versions = {(u, v): pattern(size, 1000 * u + v) for u in range(n_units) for v in range(rounds)}
    for u in range(n_units):
        store.write(u, versions[(u, 0)])
    errors = []

    def writer():
        try:
            for v in range(1, rounds):
                for u in range(n_units // 2):
                    src = unaligned(size) if v % 2 else core.aligned_buffer(size)
                    src[:] = versions[(u, v)]
                    store.write(u, src)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    def reader():
        try:
            for v in range(rounds):
                for u in range(n_units):
                    out = core.aligned_buffer(size) if v % 2 else np.zeros(size, np.uint8)
                    store.read(u, out)
                    if u >= n_units // 2:
                        assert np.array_equal(out, versions[(u, 0)])
                    else:  # being rewritten: some whole version, never a mix
                        assert any(np.array_equal(out, versions[(u, w)]) for w in range(rounds))
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=writer), threading.Thread(target=reader),
               threading.Thread(target=reader)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    for u in range(n_units // 2):
        out = np.zeros(size, np.uint8)
        store.read(u, out)
        assert np.array_equal(out, versions[(u, rounds - 1)])
    store.close()


def swap_file(store):
    (folder,) = store.usage()["dirs"]
    files = [f for f in os.listdir(folder) if f.endswith(".swp")]
    assert files == ["strata-param-r0.swp"]
    return os.path.join(folder, files[0])


def flip_byte(path, offset):
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)[0]
        f.seek(offset)
        f.write(bytes([byte ^ 0x5A]))
        f.flush()
        os.fsync(f.fileno())


def test_checksum_corruption_is_detected(swap_dir):
    store = core.ParamStore(context(swap_dir, {"nvme_checksum": True}), [8192, 100])
    assert store.usage()["checksums"]
    store.write(0, pattern(8192, 1))
    store.write(1, pattern(100, 2))
    path = swap_file(store)
    flip_byte(path, 4096 + 1234)  # the header block, then unit 0's bytes
    with pytest.raises(core.StrataError) as e:
        store.read(0, np.zeros(8192, np.uint8))
    message = str(e.value)
    assert "unit 0" in message and path in message and "checksum mismatch" in message, message
    out = np.zeros(100, np.uint8)
    store.read(1, out)  # the other unit is intact
    assert np.array_equal(out, pattern(100, 2))
    store.write(0, pattern(8192, 3))  # a new write heals it
    out = np.zeros(8192, np.uint8)
    store.read(0, out)
    assert np.array_equal(out, pattern(8192, 3))
    store.close()


def test_without_checksums_corruption_goes_unseen(swap_dir):
    store = core.ParamStore(context(swap_dir, {"nvme_checksum": False}), [8192])
    assert not store.usage()["checksums"]
    assert store.usage()["nvme_bytes"] == 8192
    store.write(0, pattern(8192, 1))
    flip_byte(swap_file(store), 4096 + 1234)
    out = np.zeros(8192, np.uint8)
    store.read(0, out)
    assert (out != pattern(8192, 1)).sum() == 1
    store.close()


def test_missing_nvme_path_names_the_key():
    with pytest.raises(core.StrataError) as e:
        core.ParamStore(context(None), [100])
    assert "zero_optimization.offload_param.nvme_path" in str(e.value)
    assert "valid" in str(e.value)


def test_budget_names_nvme_bytes_max(swap_dir):
    # 3 units of 10000 bytes: 3 x (12288 + a 4096 checksum block) = 49152 bytes.
    ctx = context(swap_dir, {"nvme_bytes_max": 49152 + 4096})
    with pytest.raises(core.StrataError) as e:
        core.ParamStore(ctx, [10000] * 4)
    assert "strata.nvme_bytes_max" in str(e.value) and "65536 bytes" in str(e.value)
    first = core.ParamStore(ctx, [10000] * 3)
    assert first.usage()["nvme_bytes"] == 49152
    # The budget is shared: what the first store took is gone until it is closed.
    with pytest.raises(core.StrataError, match="strata.nvme_bytes_max"):
        core.ParamStore(ctx, [10000])
    first.close()
    second = core.ParamStore(ctx, [10000] * 3)
    second.close()


def test_usage_counts_the_bytes_moved(swap_dir):
    sizes = [100, 4096, 5000]
    store = core.ParamStore(context(swap_dir, {"nvme_checksum": True}), sizes)
    use = store.usage()
    assert use["nvme_bytes"] == (4096 + 4096) + (4096 + 4096) + (8192 + 4096)
    assert (use["reads"], use["writes"], use["read_bytes"], use["write_bytes"]) == (0, 0, 0, 0)
    for u, n in enumerate(sizes):
        store.write(u, pattern(n, u))
    for _ in range(3):
        store.read(2, np.zeros(5000, np.uint8))
    store.read(0, core.aligned_buffer(100))
    use = store.usage()
    assert use["writes"] == 3 and use["write_bytes"] == sum(sizes)
    assert use["reads"] == 4 and use["read_bytes"] == 3 * 5000 + 100
    assert use["io_write_bytes"] == 4096 + 4096 + 8192
    assert use["io_read_bytes"] == 3 * 8192 + 4096
    # A failed call moves nothing.
    with pytest.raises(core.StrataError):
        store.read(1, np.zeros(10, np.uint8))
    assert store.usage()["reads"] == 4
    store.close()


def test_close_removes_the_folder(swap_dir):
    store = core.ParamStore(context(swap_dir), [100, 200])
    (folder,) = store.usage()["dirs"]
    assert os.path.dirname(folder) == swap_dir and os.path.isdir(folder)
    assert oct(os.stat(folder).st_mode & 0o777) == "0o700"
    store.write(0, pattern(100, 0))
    store.close()
    assert not os.path.exists(folder)
    assert os.listdir(swap_dir) == []
    for call in (lambda: store.read(0, np.zeros(100, np.uint8)),
                 lambda: store.write(0, pattern(100, 0)), store.usage, store.units,
                 lambda: store.unit_bytes(0)):
        with pytest.raises(core.StrataError, match="closed"):
            call()
    store.close()  # again: nothing to do


def test_two_stores_have_their_own_folders(swap_dir):
    ctx = context([swap_dir])  # the list form of nvme_path
    a = core.ParamStore(ctx, [100])
    b = core.ParamStore(ctx, [100])
    assert a.usage()["dirs"] != b.usage()["dirs"]
    a.write(0, np.full(100, 1, np.uint8))
    b.write(0, np.full(100, 2, np.uint8))
    out = np.zeros(100, np.uint8)
    a.read(0, out)
    assert (out == 1).all()
    a.close()
    b.read(0, out)
    assert (out == 2).all()
    b.close()


def test_argument_errors(swap_dir):
    with pytest.raises(core.StrataError, match="unit_bytes.*valid: 1 or more"):
        core.ParamStore(context(swap_dir), [100, 0])
    with pytest.raises(core.StrataError, match="unit_bytes.*at least one unit"):
        core.ParamStore(context(swap_dir), [])
    store = core.ParamStore(context(swap_dir), [100, 4096])
    with pytest.raises(core.StrataError, match="never written"):
        store.read(0, np.zeros(100, np.uint8))
    store.write(0, pattern(100, 0))
    with pytest.raises(core.StrataError, match=r"u: 2 is not a unit; valid: 0 to 1"):
        store.read(2, np.zeros(100, np.uint8))
    with pytest.raises(core.StrataError, match=r"u: -1 is not a unit"):
        store.write(-1, pattern(100, 0))
    with pytest.raises(core.StrataError, match=r"u: 5 is not a unit"):
        store.unit_bytes(5)
    with pytest.raises(core.StrataError, match="out: the array has 99 bytes.*at least 100"):
        store.read(0, np.zeros(99, np.uint8))
    with pytest.raises(core.StrataError, match="src: the array has 4095 bytes"):
        store.write(1, np.zeros(4095, np.uint8))
    with pytest.raises(core.StrataError, match="out: the array is not C-contiguous"):
        store.read(0, np.zeros(200, np.uint8)[::2])
    with pytest.raises(core.StrataError, match="src: the array is not C-contiguous"):
        store.write(0, np.zeros(200, np.uint8)[::2])
    readonly = np.zeros(100, np.uint8)
    readonly.setflags(write=False)
    with pytest.raises(core.StrataError, match="out: the array is read-only"):
        store.read(0, readonly)
    store.write(0, readonly)  # a read-only source is fine
    with pytest.raises(core.StrataError, match="out: a bytearray is not a numpy array"):
        store.read(0, bytearray(100))
    with pytest.raises(core.StrataError, match="src: an array of Python objects"):
        store.write(0, np.zeros(100, dtype=object))
    # A 2-D C-contiguous array of another dtype is fine.
    store.write(1, np.arange(1024, dtype=np.float32).reshape(32, 32))
    out = np.zeros((32, 32), np.float32)
    store.read(1, out)
    assert np.array_equal(out.ravel(), np.arange(1024, dtype=np.float32))
    store.close()
