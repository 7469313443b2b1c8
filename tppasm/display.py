"""How a kernel presents itself: its docstring and call signature (``help(kernel)``,
``inspect.signature(kernel)``), a one-line ``repr`` and a notebook HTML view.

Everything here reads a :class:`tppasm.kernel.Kernel` (descriptor, ISA, code); nothing changes it.

>>> import tppasm
>>> k = tppasm.relu(4, 8)
>>> call_text(k.desc)
"tppasm.unary('relu', 4, 8)"
>>> str(signature(k))
"(x: 'float32[4, 8]', out: 'float32[4, 8]' = None, /)"
"""
import dataclasses
import html
import inspect
import reprlib

from isa.int_text import int_text
from isa.listing import Listing


class _Short(reprlib.Repr):
    """reprlib's cut repr, with :func:`int_text` for ints (reprlib's own converts them whole)."""

    def repr_int(self, value, level):
        text = int_text(value)
        if len(text) <= self.maxlong:
            return text
        digits = len(text.lstrip("-"))
        return f"{text[:12]}...{text[-6:]} ({digits} digits)"


_SHORT = _Short()
_SHORT.maxlist = _SHORT.maxtuple = 6
_SHORT.maxstring = _SHORT.maxother = 80

CONSTRUCTORS = ("unary", "binary", "ternary", "reduce", "transform", "brgemm", "softmax", "layernorm", "rmsnorm",
                "rotary", "quantize", "dequant", "swiglu", "gemm_nt", "block_spmm")
# descriptor fields the constructors call otherwise: x's row stride is the field ldi, the keyword ldx
PUBLIC_NAMES = {"ldi": "ldx"}


def public_name(desc, name):
    """The constructors' keyword for field ``name`` of descriptor ``desc`` (x's row stride ldi is ldx)."""
    return {**PUBLIC_NAMES, **getattr(desc, "public_names", {})}.get(name, name)


def _allocated(kernel):
    """The operands the kernel's allocating form returns (kept by the kernel; asked of its descriptor
    for one assembled by hand)."""
    names = getattr(kernel, "allocated_names", None)
    return kernel.desc.allocated() if names is None else names


def call_text(desc):
    """The constructor call that builds ``desc``'s kernel, defaults left out."""
    if desc.kind not in CONSTRUCTORS or not dataclasses.is_dataclass(desc):
        return repr(desc)
    fields = dataclasses.fields(desc)
    required = {f.name: getattr(desc, f.name) for f in fields if f.default is dataclasses.MISSING}
    given = {f.name: getattr(desc, f.name) for f in fields
             if f.name not in required and getattr(desc, f.name) != f.default}
    for name in list(given):              # left out where the constructor derives it (ld = n, ...)
        rest = {k: v for k, v in given.items() if k != name}
        try:
            if type(desc)(**required, **rest) == desc:
                given = rest
        except (TypeError, ValueError):
            pass
    args = [repr(v) for v in required.values()] + [f"{public_name(desc, k)}={v!r}" for k, v in given.items()]
    return f"tppasm.{desc.kind}({', '.join(args)})"


def built_by(kernel):
    """The call that builds ``kernel``: :func:`call_text`, with ``isa=`` where it is not the host's level
    (the call without it would build another kernel).

    >>> import tppasm
    >>> built_by(tppasm.relu(2, 8, isa="avx2")) in ("tppasm.unary('relu', 2, 8, isa='avx2')",
    ...                                          "tppasm.unary('relu', 2, 8)")      # the latter on an avx2 host
    True
    """
    from isa.cpu import host
    text = call_text(kernel.desc)
    if kernel.isa == host().isa:
        return text
    return f"{text[:-1]}, isa={kernel.isa!r})" if text.startswith("tppasm.") else f"{text} (isa={kernel.isa!r})"


def _half_built(kernel):
    """The repr of a kernel whose construction has not finished (a debugger showing ``self``)."""
    return f"<{type(kernel).__name__} (not built: {', '.join(sorted(vars(kernel))) or 'no attributes'} set)>"


def _shape(spec):
    dims = (("count",) if spec.batch else ()) + tuple(spec.shape)
    return ", ".join(map(str, dims))


def annotation(spec):
    """``"float32[64, 64]"``: an operand's dtype and shape (``count`` for a batch axis)."""
    return f"{spec.np_dtype.name}[{_shape(spec)}]"


def _layout(spec):
    """Strides beyond the dense ones, in elements (the leading-dimension parameter named)."""
    dense, extent = [], 1
    for d in reversed(spec.shape):
        dense.insert(0, extent)
        extent *= d
    inner = tuple(spec.strides[spec.batch:])
    parts = []
    if inner != tuple(dense):
        parts.append(f"row stride {inner[0]}" + (f" ({spec.ld_name})" if spec.ld_name else "")
                     if len(inner) >= 2 and inner[1:] == tuple(dense[1:]) else f"strides {inner}")
    if spec.batch:
        parts.append(f"blocks {spec.strides[0]} apart")
    return ", ".join(parts)


def _batch_args(kernel):
    """{operand: (name, annotation, dtype, shape, layout)} for a BRGEMM batched by offsets or addresses,
    whose call takes A and B as whole buffers or as sequences of blocks; {} for other kernels."""
    batch = getattr(kernel.desc, "batch", "stride")
    if kernel.desc.kind != "brgemm" or batch == "stride":
        return {}
    blocks = kernel.desc.block_specs()
    if batch == "offset":
        return {s.name: (s.name, f"{s.np_dtype.name}[...]", s.np_dtype.name, "(any)",
                         f"a C-contiguous buffer; block i ({_shape(s)}{', ' + _layout(s) if _layout(s) else ''}) "
                         f"starts at element offsets[i, {j}]") for j, s in enumerate(blocks)}
    return {f"{s.name}_ptrs": (s.name, f"sequence of {annotation(s)}", s.np_dtype.name, f"count blocks ({_shape(s)})",
                               f"each {_layout(s)}" if _layout(s) else "") for s in blocks}


def operand_rows(kernel):
    """(name, dtype, shape, access, layout) per operand, in call order."""
    alloc, batch = set(_allocated(kernel)), _batch_args(kernel)
    rows = []
    for spec in kernel.operands:
        access = "written" if spec.writable else "read"
        if spec.writable and spec.name in alloc:
            access += "; allocated and returned when left out"
        elif spec.writable:
            access = "read and written"
        name, _, dtype, shape, layout = batch.get(spec.name) or (spec.name, None, spec.np_dtype.name,
                                                                 f"({_shape(spec)})", _layout(spec))
        rows.append((name, dtype, shape, access, layout))
    return rows


def call_forms(kernel):
    """How to call the kernel, e.g. ``"k(x, out) or out = k(x)"``."""
    batch = _batch_args(kernel)
    names = [batch.get(s.name, (s.name,))[0] for s in kernel.operands]
    count = "[, count=n]" if kernel.desc.count_scalar else ""
    forms = [f"k({', '.join(names)}{count})"]
    alloc = set(_allocated(kernel))
    if alloc:
        given = [n for n in names if n not in alloc]
        out = ", ".join(n for n in names if n in alloc)
        forms.append(f"{out} = k({', '.join(given)}{count})")
    return " or ".join(forms)


def wrong_call(kernel, arrays, keywords):
    """Why a call with ``arrays`` arrays (a number) and ``keywords`` is refused: an operand passed by
    name (operands are positional), a keyword the kernel does not take, or the wrong number of arrays.

    >>> import tppasm
    >>> wrong_call(tppasm.relu(4, 8), 1, {"out": None})
    'unary: pass the operands positionally, not as keywords (out=): call it as k(x, out) or out = k(x)'
    """
    kind, forms = kernel.desc.kind, call_forms(kernel)
    names = [s.name for s in kernel.operands]
    given = ", ".join(f"{k}=" for k in sorted(keywords))
    if {"out", *names} & set(keywords):
        return f"{kind}: pass the operands positionally, not as keywords ({given}): call it as {forms}"
    unknown = sorted(set(keywords) - set(kernel.scalars))
    if unknown == ["count"]:
        return f"{kind} takes no count= (it has no batch: a call computes one block); call it as {forms}"
    if unknown:
        takes = f"its only keyword is {kernel.scalars[0]}=" if kernel.scalars else "it takes no keywords"
        return f"{kind}: unexpected keyword {', '.join(f'{u}=' for u in unknown)}; {takes}: call it as {forms}"
    alloc = set(_allocated(kernel))
    inputs = [n for n in names if n not in alloc]
    also = f" or {len(inputs)} ({', '.join(inputs)}) to allocate the output" if alloc else ""
    extra = "".join(f", {s}=..." for s in kernel.scalars)
    read = [s.name for s in kernel.operands if s.writable and s.name not in alloc]
    why = f"; {' and '.join(read)} {'is' if len(read) == 1 else 'are'} read and written, so always passed" \
        if read and not alloc else ""
    got = f"got {arrays} array{'' if arrays == 1 else 's'}" + (f" and {given}" if keywords else "")
    return f"{kind} takes {len(names)} arrays ({', '.join(names)}{why}){also}{extra}; {got}"


def formula(desc):
    """What the kernel computes, in one line.

    >>> from tppasm.eltwise import Binary
    >>> formula(Binary("add", 4, 4, bcast_b="row", post="gelu"))
    'out = gelu(add(a, b)), b broadcast (row)'
    """
    kind, op = desc.kind, getattr(desc, "op", None)
    if kind == "unary":
        if op == "zero":
            return "out = 0"
        if op.endswith("_bwd"):
            return f"out = dy * {op[:-4]}'(x)" + (" (x > 0 read from mask)" if desc.bitmask else "")
        return f"out = {op}(x)" + (", mask = bits of x > 0" if desc.bitmask else "")
    if kind in ("binary", "ternary"):
        text = f"out = {op}(a, b)" if kind == "binary" else "c += a * b"
        if getattr(desc, "post", None):
            text = f"out = {desc.post}({op}(a, b))"
        casts = [f"{name[-1]} broadcast ({getattr(desc, name)})" for name in ("bcast_a", "bcast_b")
                 if getattr(desc, name)]
        return ", ".join([text] + casts)
    if kind == "reduce":
        return f"out = {op} of x over its {desc.over} ({'one per row' if desc.over == 'cols' else 'one per column'})"
    if kind == "transform":
        return {"transpose": "out = x.T"}.get(op, f"out = {op}(x) (VNNI layout change)")
    if kind == "brgemm":
        text = ("C + " if desc.beta else "") + "sum over count blocks of A[i] @ B[i]" + (" + bias" if desc.bias else "")
        return f"C = {desc.act}({text})" if desc.act else f"C = {text}"
    paragraph = " ".join(line.strip() for line in (type(desc).__doc__ or kind).strip().split("\n\n")[0].splitlines())
    return paragraph.split(". ")[0].rstrip(".")          # its first sentence


def docstring(kernel):
    """The kernel's ``__doc__``: what it computes, how to call it, its operands."""
    desc = kernel.desc
    what = formula(desc)
    lines = [f"{built_by(kernel)}, JIT'd for {kernel.isa}: {what}", "",
             f"Call it as {call_forms(kernel)}."]
    if desc.count_scalar:
        lines.append("count=: how many blocks of the batch to reduce over; left out, it is the number of "
                     "blocks the batched operands hold (they must hold the same number).")
    lines += ["", "Operands:"]
    width = max(len(s.name) for s in kernel.operands) if kernel.operands else 0
    for name, dtype, shape, access, layout in operand_rows(kernel):
        lines.append(f"  {name:<{width}}  {dtype} {shape}{', ' + layout if layout else ''}; {access}")
    lines += ["", "kernel.reference(...) computes the same with NumPy, on the same arguments as a call (in place, "
              "or allocating and returning the outputs left out); kernel.disassemble() shows the machine code."]
    return "\n".join(lines)


def _optional(kernel):
    """Operands that default to None: the allocated outputs after the last operand that is not."""
    alloc, out = set(_allocated(kernel)), set()
    for spec in reversed(kernel.operands):
        if spec.name not in alloc:
            break
        out.add(spec.name)
    return out


def signature(kernel):
    """The call signature: operands positional (annotated ``"dtype[shape]"``), outputs that the
    allocating form makes default to None when they come last, scalars keyword-only."""
    P = inspect.Parameter
    optional, batch = _optional(kernel), _batch_args(kernel)
    params = []
    for spec in kernel.operands:
        name, note = batch.get(spec.name, (spec.name, annotation(spec)))[:2]
        params.append(P(name, P.POSITIONAL_ONLY, annotation=note, default=None if spec.name in optional else P.empty))
    params += [P(name, P.KEYWORD_ONLY, default=None) for name in kernel.scalars]
    return inspect.Signature(params)


def text_signature(kernel):
    """:func:`signature` without annotations, as text (cheaply: every kernel's builtin ``__call__``
    carries it).

    >>> import tppasm
    >>> text_signature(tppasm.relu(4, 8)), text_signature(tppasm.brgemm(m=4, n=4, k=4))
    ('(x, out=None, /)', '(a, b, c=None, /, *, count=None)')
    """
    optional = _optional(kernel)
    parts = [f"{s.name}=None" if s.name in optional else s.name for s in kernel.operands]
    parts += ["/"] if parts else []
    parts += ["*"] + [f"{name}=None" for name in kernel.scalars] if kernel.scalars else []
    return f"({', '.join(parts)})"


NO_CAPSTONE = "pip install capstone (or tppasm[test])"


def machine_code(kernel):
    """The text of ``kernel``'s code (what :meth:`tppasm.kernel.Kernel.disassemble` shows); for SVE code
    without capstone (an optional package: the ``test`` extra) a ModuleNotFoundError saying what to
    install."""
    try:
        return kernel.raw.disassemble()
    except ModuleNotFoundError as e:
        if e.name != "capstone":
            raise
        raise ModuleNotFoundError(f"{kernel.desc.kind}: disassembling {kernel.isa} code needs capstone: "
                                  f"{NO_CAPSTONE}", name="capstone") from e


def _disassembler_missing(error):
    return isinstance(error, ModuleNotFoundError) and error.name == "capstone"


def instructions(kernel):
    """The instruction that does the kernel's work, e.g. ``"vfmadd231ps zmm, 24 accumulators"``; None for
    SVE code when capstone, which reads it, is not installed."""
    cached = getattr(kernel, "_instructions", None)
    if cached is None:
        code = getattr(kernel.raw, "code", b"")
        if kernel.isa in ("avx2", "avx512", "amx"):
            from isa.x86.disasm import main_instruction
            cached = main_instruction(code, gemm=kernel.desc.kind == "brgemm")
        else:
            try:
                mix = kernel.instruction_mix()     # SVE: floating-point and dot-product ops do the work
            except ModuleNotFoundError as e:
                if not _disassembler_missing(e):
                    raise
                return None                        # (not kept: capstone may be installed later)
            work = [mn for mn in mix if mn.startswith(("f", "bf")) or mn.endswith(("dot", "mmla"))]
            cached = f"{work[0]} (sve)" if work else "data movement (sve)"
        kernel._instructions = cached
    return cached


def instruction_mix(kernel):
    """:meth:`tppasm.kernel.Kernel.instruction_mix`: static counts of each instruction, most frequent first."""
    if kernel.isa in ("avx2", "avx512", "amx"):
        from isa.x86.disasm import instruction_mix as x86_mix
        return x86_mix(kernel.raw.code)
    counts = {}
    for line in machine_code(kernel).splitlines():     # AArch64: "offset: word  mnemonic ..."
        parts = line.split()
        if len(parts) >= 3:
            counts[parts[2]] = counts.get(parts[2], 0) + 1
    return dict(sorted(counts.items(), key=lambda kv: -kv[1]))


def _size(nbytes):
    return f"{nbytes} bytes" if nbytes < 4096 else f"{nbytes / 1024:.1f} KiB"


def _obtained(kernel):
    """``JIT 0.8 ms``, or ``loaded from disk in 0.3 ms`` for a kernel the code cache had stored (its
    code was not JIT'd here: the time is the load's)."""
    ms = f"{kernel.jit_seconds * 1e3:.1f} ms"
    return f"loaded from disk in {ms}" if getattr(kernel, "from_disk", False) else f"JIT {ms}"


def shown(value, limit=80):
    """``repr(value)`` for an error message, cut to about ``limit`` characters (a list of a million
    numbers passed as a size must not make a message of megabytes).

    >>> shown(list(range(10**6)))
    '[0, 1, 2, 3, 4, 5, ...]'
    >>> shown("x" * 200)[-26:], shown(7), shown(10**5000)
    ("xxxxx...' (200 characters)", '7', '<an int of 5001 digits>')
    """
    if isinstance(value, str) and len(value) > limit:
        return repr(value[:limit - 20])[:-1] + f"...' ({len(value)} characters)"
    text = _SHORT.repr(value)
    return text if len(text) <= limit + 20 else text[:limit] + "..."


def printable(text):
    """``text`` with its non-printable characters (ESC, other controls, line breaks, DEL, C1, format
    characters) written as Python escapes, so that terminal output built from user text cannot move
    the cursor, clear the screen or break a line.

    >>> printable("ab\\x1b[2J\\r\\n\\x7f é")
    'ab\\\\x1b[2J\\\\r\\\\n\\\\x7f é'
    """
    text = str(text)
    return text if text.isprintable() else "".join(c if c.isprintable() else ascii(c)[1:-1] for c in text)


def kernel_repr(kernel):
    """``<ReluKernel tppasm.unary('relu', 64, 64) on avx512: vmaxps zmm, 212 bytes, JIT 0.8 ms>``."""
    try:
        code = getattr(kernel.raw, "code", b"")
        work = instructions(kernel)                # (None: SVE code, capstone not installed)
        return (f"<{type(kernel).__name__} {built_by(kernel)} on {kernel.isa}: {f'{work}, ' if work else ''}"
                f"{_size(len(code))}, {_obtained(kernel)}>")
    except AttributeError:
        if all(hasattr(kernel, a) for a in ("desc", "isa", "raw", "operands", "jit_seconds")):
            raise
        return _half_built(kernel)


def html_table(rows, head=None):
    """``rows`` (sequences of values) as an HTML table, with a header row if ``head`` is given."""
    cells = "".join("<tr>" + "".join(f"<td style='text-align:left'>{html.escape(str(c))}</td>" for c in row)
                    + "</tr>" for row in rows)
    top = "<tr>" + "".join(f"<th style='text-align:left'>{html.escape(h)}</th>" for h in head) + "</tr>" \
        if head else ""
    return f"<table>{top}{cells}</table>"


def kernel_html(kernel):
    """A notebook view: what the kernel is, what it runs, its operands, and its code (folded)."""
    if not all(hasattr(kernel, a) for a in ("desc", "isa", "raw", "operands", "jit_seconds")):
        return f"<div>{html.escape(_half_built(kernel))}</div>"
    code = getattr(kernel.raw, "code", b"")
    facts = [("built by", built_by(kernel)), ("ISA level", kernel.isa),
             ("instructions", instructions(kernel) or f"(to read them: {NO_CAPSTONE})"),
             ("code size", _size(len(code))),
             ("load time (disk cache)" if getattr(kernel, "from_disk", False) else "JIT time",
              f"{kernel.jit_seconds * 1e3:.2f} ms"), ("call", call_forms(kernel))]
    if not kernel.runnable:
        facts.append(("runs", f"not on this host (no {kernel.isa}): in the interpreter or an emulator"))
    return (f"<div><b>{html.escape(type(kernel).__name__)}</b>{html_table(facts)}"
            f"{html_table(operand_rows(kernel), ('operand', 'dtype', 'shape', 'access', 'layout'))}"
            f"{_code_html(kernel)}</div>")


def _code_html(kernel):
    """The kernel's code as a folded, highlighted listing (or what to install to see it)."""
    try:
        listing = Listing(machine_code(kernel))
    except ModuleNotFoundError as e:
        if not _disassembler_missing(e):
            raise
        return f"<p>machine code: {html.escape(NO_CAPSTONE)} to see it</p>"
    return (f"<details><summary>machine code ({len(listing.splitlines())} instructions)</summary>"
            f"{listing._repr_html_()}</details>")


def class_name(desc):
    """``ReluKernel``, ``BrgemmKernel``: the name of a kernel's own class."""
    base = getattr(desc, "op", None) or desc.kind
    return "".join(part.capitalize() for part in str(base).split("_")) + "Kernel"
