"""Disassembly listings: plain text that notebooks show syntax-highlighted.

A :class:`Listing` is a ``str`` (print it, search it, compare it) whose ``_repr_html_`` colours
each line's offset, bytes, mnemonic (by class: compute, memory, control flow) and operands
(registers, memory references, immediates). It reads both listings tppasm prints: x86
(``0004  c3                    ret``) and AArch64 (``       0: d65f03c0  ret``).

>>> text = Listing("0000  c3                    ret")
>>> text.upper()[:4], "<pre" in text._repr_html_(), 'class="asm-ctl">ret' in text._repr_html_()
('0000', True, True)
"""
import html
import re

LINE = re.compile(r"^(?P<off>\s*[0-9a-f]+:?)(?P<gap1>\s+)(?P<hex>[0-9a-f]+)(?P<gap2>\s+)(?P<mn>\S+)(?P<rest>.*)$")
OPERAND = re.compile(
    r"(?P<mem>\[[^\]]*\])"
    r"|(?P<reg>\b(?:[xyz]mm\d+|tmm[0-7]|k[0-7]|r(?:1[0-5]|[89])[dwb]?|[re]?(?:ax|bx|cx|dx|si|di|sp|bp|ip)|"
    r"[abcd][lh]|(?:si|di|sp|bp)l|[xwvqdshb](?:[12]?\d|3[01])|z(?:[12]?\d|3[01])(?:\.[bhsdq])?|"
    r"p1[0-5]|p\d|xzr|wzr)\b(?:/[zm])?)"
    r"|(?P<imm>#?-?\b(?:0x[0-9a-f]+|\d+)h?\b)",
    re.IGNORECASE)
CONTROL = re.compile(r"^(j[a-z]+|call|ret|loop\w*|b|bl|br|blr|b\.\w+|cbn?z|tbn?z)$")
MEMORY = re.compile(r"^(v?p?mov\w*|v?p?broadcast\w*|push|pop|lea|prefetch\w*|tileloadd\w*|tilestored|ldtilecfg|"
                    r"sttilecfg|ld\w*|st\w*|vgather\w*|vscatter\w*|k?mov\w*|vmaskmov\w*)$")
STYLE = ("<style>.asm-listing{font-family:monospace;font-size:12px;line-height:1.35}"
         ".asm-off{color:#999}.asm-hex{color:#bbb}.asm-cmp{color:#0550ae;font-weight:bold}"
         ".asm-mem{color:#116329}.asm-ctl{color:#8250df;font-weight:bold}.asm-op{color:#24292f}"
         ".asm-reg{color:#bc4c00}.asm-addr{color:#6e4400}.asm-imm{color:#0a7a7a}</style>")


def mnemonic_class(mnemonic):
    """"ctl" (control flow), "mem" (data movement) or "cmp" (everything else: computation).

    >>> mnemonic_class("jne"), mnemonic_class("vmovups"), mnemonic_class("vfmadd231ps")
    ('ctl', 'mem', 'cmp')
    """
    m = mnemonic.lower()
    return "ctl" if CONTROL.match(m) else "mem" if MEMORY.match(m) else "cmp"


def _operands(text):
    out, last = [], 0
    for match in OPERAND.finditer(text):
        out.append(html.escape(text[last:match.start()]))
        kind = {"mem": "addr", "reg": "reg", "imm": "imm"}[match.lastgroup]
        out.append(f'<span class="asm-{kind}">{html.escape(match.group())}</span>')
        last = match.end()
    out.append(html.escape(text[last:]))
    return "".join(out)


def highlight_html(text):
    """The listing ``text`` as an HTML ``<pre>`` block with coloured spans (lines it cannot parse
    are kept as they are, escaped)."""
    lines = []
    for line in text.splitlines():
        match = LINE.match(line)
        if match is None:
            lines.append(html.escape(line))
            continue
        g = match.groupdict()
        mn = g["mn"]
        lines.append(f'<span class="asm-off">{html.escape(g["off"])}</span>{g["gap1"]}'
                     f'<span class="asm-hex">{g["hex"]}</span>{g["gap2"]}'
                     f'<span class="asm-{mnemonic_class(mn)}">{html.escape(mn)}</span>{_operands(g["rest"])}')
    return STYLE + '<pre class="asm-listing">' + "\n".join(lines) + "</pre>"


class Listing(str):
    """A disassembly listing: a ``str`` that Jupyter shows syntax-highlighted."""

    def _repr_html_(self):
        return highlight_html(self)

    def _repr_pretty_(self, printer, cycle):
        """IPython's plain-text view: the lines themselves, not a quoted string."""
        printer.text(str(self))
