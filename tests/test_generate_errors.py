"""Generator errors reach the user as they are, except the x86 encoder's refusal of an offset
past 32 bits (explained as such); the SVE-only MMLA layout of B is refused on x86."""
import pytest

import tppasm as tpp
from tppasm.brgemm import Brgemm
from tppasm.gemm_nt import GemmNT
from tppasm.kernel import Kernel
from tppasm.sve.brgemm import MmlaBrgemm


@pytest.mark.parametrize("isa", ["avx2", "avx512", "amx"])
@pytest.mark.parametrize("dtype", ["bf16", "i8"])
def test_mmla_layout_is_refused_on_x86(isa, dtype):
    with pytest.raises(ValueError, match=r"layout='sve_mmla' is SVE only.*vnni_pack"):
        Kernel(MmlaBrgemm(m=2, n=3, k=8, dtype=dtype), isa)


def test_mmla_layout_still_builds_on_sve():
    assert Kernel(MmlaBrgemm(m=2, n=3, k=8, dtype="bf16"), "sve").raw.code


@pytest.mark.parametrize("lda", [8, 2 ** 26])
def test_sve_errors_keep_their_reason_with_huge_fields(lda):
    with pytest.raises(ValueError, match="signs='su' is not supported") as e:
        tpp.brgemm(m=4, n=5, k=4, dtype="i8", signs="su", lda=lda, isa="sve")
    assert "x86" not in str(e.value) and "2 GiB" not in str(e.value)


@pytest.mark.parametrize("isa", ["sve", "avx512"])
def test_descriptor_checks_are_not_rewritten_as_offset_errors(isa):
    with pytest.raises(ValueError, match="more than 64 MiB per row") as e:
        Kernel(GemmNT(3, 5, 4, lda=2 ** 25 + 4), isa)
    assert "2 GiB" not in str(e.value)


@pytest.mark.parametrize("isa", ["avx2", "avx512"])
def test_x86_encoder_offset_errors_are_explained(isa):
    with pytest.raises(ValueError, match="x86 displacements and immediates are 32-bit.*under 2 GiB"):
        Kernel(Brgemm(m=4, n=5, k=4, lda=2 ** 30), isa)


@pytest.mark.parametrize("isa", ["avx2", "avx512"])
def test_offset_errors_name_the_leading_dimension_not_the_default_batch_stride(isa):
    with pytest.raises(ValueError, match=r"brgemm: lda=268435453 needs an address offset") as e:
        tpp.brgemm(3, 20, 9, lda=268435453, isa=isa)
    assert "stride_a" not in str(e.value)


def test_gemm_nt_long_dense_rows_are_cut_by_splitting_k_or_n():
    with pytest.raises(ValueError, match=r"k=16777217 makes each row of A and B span more than 64 MiB; split k") as e:
        tpp.gemm_nt(1, 1, 2 ** 24 + 1)
    assert "copy" not in str(e.value)
    with pytest.raises(ValueError, match=r"n=16777217 makes each row of C .* split n into column blocks"):
        tpp.gemm_nt(1, 2 ** 24 + 1, 4)
    with pytest.raises(ValueError, match=r"lda=16777217 spans more than 64 MiB per row; call it on a copy"):
        tpp.gemm_nt(2, 2, 4, lda=2 ** 24 + 1)


def test_int_subclass_fields_become_plain_ints():
    import enum

    class Dim(enum.IntEnum):
        BIG, ROWS = 2 ** 30, 5
    with pytest.raises(ValueError, match=r"brgemm: lda=1073741824 needs an address offset") as e:
        tpp.brgemm(4, 5, 4, lda=Dim.BIG)
    assert "stride_a" not in str(e.value)
    k = tpp.unary("relu", Dim.ROWS, 17)
    assert type(k.desc.m) is int and "Dim" not in repr(k)


@pytest.mark.parametrize("fields", [dict(ldi=2 ** 63), dict(m=2 ** 63), dict(ldi=-2 ** 63), dict(n=2 ** 64)],
                         ids=["ldi", "m", "negative", "n"])
def test_descriptor_fields_past_int64_are_refused_as_such(fields):
    """The descriptor's own check (its fast path for plain ints included), not a generator's later
    refusal of an offset it cannot encode."""
    from tppasm.eltwise import Unary
    with pytest.raises(ValueError, match=r"unary: (ldx|m|n)=-?\d+; expected an int below 2\*\*63"):
        Unary(**{"op": "relu", "m": 2, "n": 3, **fields})
    with pytest.raises(ValueError, match=r"expected an int below 2\*\*63"):
        Brgemm(**{"m": 2, "n": 3, "k": 4, **{"lda" if k == "ldi" else k: v for k, v in fields.items()}})
    assert Unary("relu", 2, 3, 2 ** 63 - 1).ldi == 2 ** 63 - 1          # (int64's largest: the descriptor takes it)


def test_gemm_nt_advises_a_copy_only_where_dense_rows_fit():
    with pytest.raises(ValueError, match=r"k=16777217 makes each row of A and B span more than 64 MiB; split k"):
        tpp.gemm_nt(1, 1, 2 ** 24 + 1, lda=2 ** 24 + 2)


def test_mmla_brgemm_refuses_another_layout():
    # any other layout built the dot kernel over an MMLA-packed B: wrong results, no error
    with pytest.raises(ValueError, match=r"layout='vnni'; expected 'sve_mmla'"):
        Kernel(MmlaBrgemm(m=4, n=8, k=16, dtype="bf16", layout="vnni"), "sve")
    with pytest.raises(ValueError, match=r"layout=5; expected a string"):
        MmlaBrgemm(m=4, n=8, k=16, dtype="bf16", layout=5)


def test_str_subclass_fields_become_plain_strings():
    import enum

    import numpy as np

    class Op(str, enum.Enum):
        RELU, BF16 = "relu", "bf16"
    k = tpp.unary(Op.RELU, 5, 9, dtype=Op.BF16)
    assert type(k.desc.op) is str and type(k.desc.dtype) is str and "Op" not in repr(k)
    assert type(tpp.brgemm(2, 2, 2, batch=np.str_("offset")).desc.batch) is str
