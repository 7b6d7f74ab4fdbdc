"""The pure-Python XXH64 against published vectors and against the `xxhash` package."""

from __future__ import annotations

import ast
import random
import sys
from pathlib import Path

import pytest
import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st

from walj.log import _xxh64
from walj.log._xxh64 import xxh64_hexdigest, xxh64_intdigest

PRIME32 = 2654435761
PRIME64 = 11400714785074694797


def _sanity_buffer(length: int) -> bytes:
    """The test buffer of xxHash's own sanity check (cli/xsum_sanity_check.c)."""
    out = bytearray(length)
    gen = PRIME32
    for i in range(length):
        out[i] = gen >> 56
        gen = (gen * PRIME64) & 0xFFFFFFFFFFFFFFFF
    return bytes(out)


def _random_bytes(length: int, salt: int = 0) -> bytes:
    return random.Random(length * 1_000_003 + salt).randbytes(length)


def _check(data: bytes | bytearray | memoryview, seed: int = 0) -> None:
    expected = xxhash.xxh64_intdigest(data, seed)
    assert xxh64_intdigest(data, seed) == expected, (len(data), seed)
    assert xxh64_hexdigest(data, seed) == xxhash.xxh64_hexdigest(data, seed), (len(data), seed)


# --- published vectors, independent of the xxhash package ---


def test_empty_input_seed_zero() -> None:
    assert xxh64_intdigest(b"") == 0xEF46DB3751D8E999
    assert xxh64_hexdigest(b"") == "ef46db3751d8e999"


# (length, seed, XXH64) on the sanity buffer, as listed in xxHash's cli/xsum_sanity_check.c.
SANITY_VECTORS = [
    (0, 0, 0xEF46DB3751D8E999),
    (0, PRIME32, 0xAC75FDA2929B17EF),
    (1, 0, 0xE934A84ADB052768),
    (1, PRIME32, 0x5014607643A9B4C3),
    (4, 0, 0x9136A0DCA57457EE),
    (14, 0, 0x8282DCC4994E35C8),
    (14, PRIME32, 0xC3BD6BF63DEB6DF0),
    (222, 0, 0xB641AE8CB691C174),
    (222, PRIME32, 0x20CB8AB7AE10C14A),
]


@pytest.mark.parametrize(("length", "seed", "expected"), SANITY_VECTORS)
def test_xxhash_sanity_vectors(length: int, seed: int, expected: int) -> None:
    assert xxh64_intdigest(_sanity_buffer(length), seed) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (b"a", "d24ec4f1a98c6e5b"),
        (b"abc", "44bc2cf5ad770999"),
        # Also a digest with a leading zero digit, which must be kept.
        (b"The quick brown fox jumps over the lazy dog", "0b242d361fda71bc"),
    ],
)
def test_text_vectors(text: bytes, expected: str) -> None:
    assert xxh64_hexdigest(text) == expected
    assert xxh64_intdigest(text) == int(expected, 16)


# --- against the xxhash package ---


def test_every_length_up_to_300() -> None:
    for length in range(301):
        _check(_random_bytes(length))


@pytest.mark.parametrize("fill", [0x00, 0xFF])
def test_stripe_boundaries(fill: int) -> None:
    for stripes in range(6):
        for extra in range(-5, 6):
            length = stripes * 32 + extra
            if length >= 0:
                _check(bytes([fill]) * length)
    for length in (255, 256, 257, 1023, 1024, 1025, 4096, 4099):
        _check(bytes([fill]) * length)


@pytest.mark.parametrize("length", [100_000, 102_400 + 31, 1 << 20])
def test_large_inputs(length: int) -> None:
    _check(_random_bytes(length))


def test_large_input_of_ones() -> None:
    _check(b"\xff" * 100_003)


SEEDS = [1, 2, PRIME32, PRIME64, 1 << 63, (1 << 64) - 1, 0x0123456789ABCDEF]


@pytest.mark.parametrize("seed", SEEDS)
def test_nonzero_seeds(seed: int) -> None:
    for length in (*range(0, 80), 127, 128, 129, 200, 1000, 5000):
        _check(_random_bytes(length, salt=seed), seed)


def test_seed_is_taken_modulo_2_64() -> None:
    data = _random_bytes(100)
    assert xxh64_intdigest(data, -1) == xxh64_intdigest(data, (1 << 64) - 1)
    assert xxh64_intdigest(data, (1 << 64) + 7) == xxh64_intdigest(data, 7)


def test_bytearray_and_memoryview_inputs() -> None:
    for length in (0, 3, 7, 8, 31, 32, 33, 100, 200, 257):
        data = _random_bytes(length, salt=1)
        expected = xxhash.xxh64_intdigest(data)
        assert xxh64_intdigest(bytearray(data)) == expected
        assert xxh64_intdigest(memoryview(data)) == expected
        assert xxh64_intdigest(memoryview(bytearray(data))) == expected
        assert xxh64_hexdigest(memoryview(data), 5) == xxhash.xxh64_hexdigest(data, 5)
        assert xxh64_hexdigest(bytearray(data), 5) == xxhash.xxh64_hexdigest(data, 5)


def test_memoryview_slices_and_formats() -> None:
    blob = _random_bytes(1000, salt=2)
    view = memoryview(blob)
    for start, stop in ((1, 201), (3, 35), (7, 1000), (500, 503), (999, 1000)):
        _check(view[start:stop])
        assert xxh64_intdigest(view[start:stop]) == xxhash.xxh64_intdigest(blob[start:stop])
    # A view with another item format is hashed over its raw bytes, as xxhash does.
    words = view[:400].cast("I")
    assert xxh64_intdigest(words) == xxhash.xxh64_intdigest(blob[:400])


def test_rejects_non_buffers() -> None:
    with pytest.raises(TypeError):
        xxh64_intdigest(5)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        xxh64_hexdigest("text")  # type: ignore[arg-type]


def test_hexdigest_is_16_lowercase_zero_padded_digits() -> None:
    # Inputs whose digest is below 2**60 must still give 16 digits, the first being zero.
    found = 0
    for i in range(2000):
        data = i.to_bytes(4, "little") * (i % 20)
        digest = xxh64_hexdigest(data)
        assert len(digest) == 16 and digest == digest.lower()
        assert int(digest, 16) == xxhash.xxh64_intdigest(data)
        found += digest.startswith("0")
    assert found > 0


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=2000), st.integers(0, 2**64 - 1))
def test_matches_xxhash(data: bytes, seed: int) -> None:
    assert xxh64_intdigest(data, seed) == xxhash.xxh64_intdigest(data, seed)
    assert xxh64_hexdigest(data, seed) == xxhash.xxh64_hexdigest(data, seed)


# --- the module itself ---


def test_imports_only_the_standard_library() -> None:
    tree = ast.parse(Path(_xxh64.__file__).read_text(encoding="utf-8"))
    imported: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, "the module must not import from the walj package"
            assert node.module is not None
            imported.add(node.module.split(".")[0])
    assert imported, "found no imports at all; the check is not looking at the right file"
    assert imported <= set(sys.stdlib_module_names) | {"__future__"}, imported
