"""Checks of the bench suites' options, as argparse ``type=`` functions: a bad value is refused
before any work, by argparse (its usage, exit status 2), with a message that names what was
expected and gives an example of what to write::

    error: argument --threads: '0': expected numbers of threads from 1 to 4096, comma separated, each once, e.g. --threads 1,2

Files a suite writes (``--json``, ``--plot``) are checked the same way: their directory exists
and is writable, and a plot's name ends in a format matplotlib writes. So are sizes whose arrays
need more than the machine's physical memory (:func:`check_memory`, after parsing).

>>> threads = counts("threads", "--threads 1,2", most=MAX_THREADS)
>>> threads("1,4")
[1, 4]
>>> threads("1,,2")
Traceback (most recent call last):
...
argparse.ArgumentTypeError: '1,,2': expected numbers of threads from 1 to 4096, comma separated, each once, e.g. --threads 1,2
"""
import argparse
import math
import os
import tempfile

from isa.pool import MAX_THREADS      # the most threads a pool takes (torch.set_num_threads crashed far above)

# Upper bounds of the suites' sizes: far above any sensible run, below what fails deep inside one
# (NumPy's "Maximum allowed dimension exceeded", 32-bit displacements, torch's 64-bit seeds)
MAX_SIDE = 1 << 16          # a matrix side (m, n, k, features): a 65536 x 65536 fp32 matrix is 16 GiB
MAX_ROWS = 1 << 20          # rows of activations (tokens x batch)
MAX_BATCH = 1 << 10         # images of a convolution batch
MAX_LAYERS = 1 << 10
MAX_SEED = (1 << 32) - 1


def checked(convert, expected, example):
    """An argparse ``type=``: ``convert(text)``, or, where that raises ValueError, argparse's error
    ``'TEXT': expected EXPECTED, e.g. EXAMPLE``.

    >>> checked(int, "a whole number", "--n 4")("x")
    Traceback (most recent call last):
    ...
    argparse.ArgumentTypeError: 'x': expected a whole number, e.g. --n 4
    """
    def check(text):
        try:
            return convert(text)
        except TooLarge as e:
            raise argparse.ArgumentTypeError(f"{text!r}: expected {expected}; {e}, e.g. {example}") from None
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r}: expected {expected}, e.g. {example}") from None
    return check


class TooLarge(ValueError):
    """A value above an option's ``limit``: :func:`checked` adds the limit to its message."""


def whole(text, least=1, most=None, limit=None):
    """``text`` as an int from ``least`` to ``most`` (None: no limit); ValueError otherwise, and
    :class:`TooLarge` above ``limit`` (a sanity bound, named only to a value above it).

    >>> whole(" 8 "), whole("0", least=0)
    (8, 0)
    >>> checked(lambda text: whole(text, limit=64), "a positive size", "--n 8")("65")
    Traceback (most recent call last):
    ...
    argparse.ArgumentTypeError: '65': expected a positive size; 65 is over the limit of 64, e.g. --n 8
    """
    value = int(text)
    if value < least or (most is not None and value > most):
        raise ValueError(f"{value} is out of range")
    if limit is not None and value > limit:
        raise TooLarge(f"{value} is over the limit of {limit}")
    return value


def real(text, least=0.0, most=math.inf, strict=False):
    """``text`` as a finite float from ``least`` to ``most`` (above ``least`` when ``strict``);
    ValueError otherwise.

    >>> real("0.5"), real("1e-3", strict=True)
    (0.5, 0.001)
    """
    value = float(text)
    if not (math.isfinite(value) and least <= value <= most) or (strict and value == least):
        raise ValueError(f"{value} is out of range")
    return value


def items(text):
    """The comma-separated items of ``text``; ValueError when it or one of them is empty.

    >>> items("1, 2")
    ['1', ' 2']
    """
    out = text.split(",")
    if not all(s.strip() for s in out):
        raise ValueError("an empty item")
    return out


def _amount(what, least, most, plural):
    """'a positive number of rounds', 'numbers of threads from 1 to 4096', ... for the messages."""
    if most is not None:
        return f"{'numbers' if plural else 'a number'} of {what} from {least} to {most}"
    if least == 1:
        return f"{'positive numbers' if plural else 'a positive number'} of {what}"
    return f"{'numbers' if plural else 'a number'} of {what}, {least} or more"


def count(what, example, least=1, most=None, limit=None):
    """An argparse ``type=`` for one whole number of ``what`` from ``least`` to ``most``
    (``limit``: see :func:`whole`).

    >>> count("rounds", "--rounds 9")("0")
    Traceback (most recent call last):
    ...
    argparse.ArgumentTypeError: '0': expected a positive number of rounds, e.g. --rounds 9
    """
    return checked(lambda text: whole(text, least, most, limit), _amount(what, least, most, False), example)


def counts(what, example, least=1, most=None, limit=None):
    """An argparse ``type=`` for a comma list of whole numbers of ``what`` (see :func:`count`), each
    once (a repeated one would run a row twice).

    >>> counts("threads", "--threads 1,2")("1,2,1")
    Traceback (most recent call last):
    ...
    argparse.ArgumentTypeError: '1,2,1': expected positive numbers of threads, comma separated, each once, e.g. --threads 1,2
    """
    return checked(lambda text: once([whole(s, least, most, limit) for s in items(text)]),
                   _amount(what, least, most, True) + ", comma separated, each once", example)


def once(values):
    """``values``, a list; ValueError when one of them is repeated."""
    if len(set(values)) != len(values):
        raise ValueError("a repeated item")
    return values


def seconds(example, strict=False):
    """An argparse ``type=`` for a finite number of seconds, 0 or more (above 0 where ``strict``).

    >>> seconds("--tune-seconds 20")("nan")
    Traceback (most recent call last):
    ...
    argparse.ArgumentTypeError: 'nan': expected a number of seconds, 0 or more, e.g. --tune-seconds 20
    """
    return checked(lambda text: real(text, strict=strict),
                   f"a number of seconds, {'above 0' if strict else '0 or more'}", example)


def names(what, choices, example):
    """An argparse ``type=`` for a comma list of ``what`` out of ``choices``.

    >>> names("dtypes", ("f32", "bf16"), "--dtypes f32")("f32,f16")
    Traceback (most recent call last):
    ...
    argparse.ArgumentTypeError: 'f32,f16': expected dtypes out of f32, bf16, comma separated, each once, e.g. --dtypes f32
    """
    def convert(text):
        out = [s.strip() for s in items(text)]
        if any(s not in choices for s in out):
            raise ValueError("not a choice")
        return once(out)
    return checked(convert, f"{what} out of {', '.join(choices)}, comma separated, each once", example)


def shapes(what, example, dims, most=None, limit=MAX_SIDE):
    """An argparse ``type=`` for a comma list of shapes ``AxB...`` with ``dims`` positive sizes
    each (at most ``most``, a tuple per dimension, None entries no limit; each at most ``limit``,
    see :func:`whole`), as tuples.

    >>> shapes("batch x tokens", "--shapes 1x32", 2, most=(None, 512))("8x128,1x32")
    [(8, 128), (1, 32)]
    """
    limits = most or (None,) * dims

    def shape(item):
        sizes = item.lower().split("x")
        if len(sizes) != dims:
            raise ValueError(f"{len(sizes)} sizes")
        return tuple(whole(s, 1, top, limit) for s, top in zip(sizes, limits))
    bounds = "".join(f", size {i} at most {top}" for i, top in enumerate(limits, 1) if top is not None)
    return checked(lambda text: once([shape(s) for s in items(text)]),
                   f"{what} of positive sizes{bounds}, comma separated, each once", example)


def writable_file(example, empty=False):
    """An argparse ``type=`` for a file to write: a name (or '' where ``empty``) in a directory that
    exists and is writable, not a directory itself; refused with a message saying which.

    >>> writable_file("--json run.json")("/no/such/dir/run.json")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    argparse.ArgumentTypeError: '/no/such/dir/run.json': directory '/no/such/dir' does not exist ... run.json
    """
    def check(text):
        if text == "" and empty:
            return text
        problem = _unwritable(text)
        if problem:
            raise argparse.ArgumentTypeError(f"{text!r}: {problem}, e.g. {example}")
        return text
    return check


def _unwritable(path):
    """Why ``path`` cannot be written as a file ('' when it can)."""
    if not path or path.endswith(os.sep) or os.path.isdir(path):
        return "expected the name of a file to write, not a directory"
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        return f"directory {os.path.dirname(path)!r} does not exist (create it first)"
    if not os.access(folder, os.W_OK | os.X_OK) or (os.path.exists(path) and not os.access(path, os.W_OK)):
        return "no permission to write it"
    exists = os.path.exists(path)
    try:                    # (root passes os.access on any file system, /proc and read-only mounts too)
        if exists:
            open(path, "r+b").close()
        else:
            tempfile.TemporaryFile(dir=folder).close()
    except OSError as e:
        return f"cannot {'open it for writing' if exists else f'create a file in {folder!r}'} ({e.strerror or e})"
    return ""


def plot_formats():
    """The file name endings matplotlib writes (its own list where it is installed; None when it is not).

    >>> formats = plot_formats(); formats is None or {"png", "svg", "pdf"} <= set(formats)
    True
    """
    try:
        from matplotlib.backend_bases import FigureCanvasBase
    except ImportError:
        return None
    return tuple(sorted(FigureCanvasBase.get_supported_filetypes()))


def plot_file(text):
    """An argparse ``type=`` for ``--plot FILE``: a writable file (:func:`writable_file`) whose name
    ends in a format matplotlib writes, with matplotlib installed.

    >>> plot_file("run.txt")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    argparse.ArgumentTypeError: 'run.txt': expected a name ending in a format matplotlib writes ..., e.g. --plot run.png
    """
    text = writable_file("--plot run.png")(text)
    formats = plot_formats()
    if formats is None:
        raise argparse.ArgumentTypeError(f"{text!r}: matplotlib is not installed, so nothing could draw it "
                                         "(pip install matplotlib)")
    ending = text.rpartition(".")[2].lower()
    if ending not in formats:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a name ending in a format matplotlib writes (.png, "
                                         ".svg, .pdf, ...), e.g. --plot run.png")
    if ending in needs_tex():
        raise argparse.ArgumentTypeError(f"{text!r}: matplotlib draws .{ending} through a TeX system (xelatex, "
                                         "latex), which the run may lack; expected .png, .svg or .pdf, e.g. "
                                         "--plot run.png")
    return text


def needs_tex():
    """The plot formats matplotlib writes only through a TeX system: pgf always, every one where
    matplotlib's ``text.usetex`` setting is on.

    >>> "pgf" in needs_tex()
    True
    """
    from matplotlib import rcParams
    return plot_formats() if rcParams["text.usetex"] else ("pgf",)


def physical_memory():
    """Bytes of physical memory of this machine (``os.sysconf``), or None where the system does not say.

    >>> m = physical_memory(); m is None or m > 0
    True
    """
    try:
        pages, size = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return None
    return pages * size if pages > 0 and size > 0 else None


def check_memory(parser, option, value, needed, example):
    """argparse's error (exit 2) when ``needed`` bytes (the arrays ``option``'s ``value`` makes a
    run allocate) exceed the machine's physical memory: refused before any work, never a late
    MemoryError or the OOM killer.

    >>> p = argparse.ArgumentParser(prog="bench")
    >>> check_memory(p, "--sizes", "512", 3 << 20, "--sizes 512")        # fits: nothing happens
    """
    have = physical_memory()
    if have is not None and needed > have:
        parser.error(f"argument {option}: {value}: the arrays need about {needed / 2 ** 30:.1f} GiB, more than "
                     f"this machine's {have / 2 ** 30:.1f} GiB of memory; choose less, e.g. {example}")


def json_option(parser):
    """Add ``--json FILE`` (checked: :func:`writable_file`): where a suite writes its records."""
    parser.add_argument("--json", metavar="FILE", type=writable_file("--json run.json"),
                        help="write the records to this file (as JSON)")


GEMM_SIDES = {"m": ("rows m", "rows of C"), "n": ("columns n", "columns of C"),
              "k": ("inner k", "the inner dimension")}


def side_options(parser, sides="mn", default=64):
    """Add ``--m``, ``--n``, ``--k`` (those in ``sides``; checked, at most :data:`MAX_SIDE`): the
    GEMM shape of the static-model suites."""
    for side in sides:
        what, text = GEMM_SIDES[side]
        parser.add_argument(f"--{side}", type=count(what, f"--{side} {default}", limit=MAX_SIDE), default=default,
                            help=f"{text} (default {default})")


def threads_option(parser, default="1,2"):
    """Add ``--threads N,...`` (checked): the thread counts each row of a suite is run on."""
    parser.add_argument("--threads", type=counts("threads", "--threads 1,2", most=MAX_THREADS), default=default,
                        metavar="N,...", help=f"comma list of thread counts, 1 to {MAX_THREADS} (default {default})")


def tuning_options(parser, budget_help):
    """Add the tuned suites' ``--no-tune``, ``--tune-seconds S`` (``budget_help``: its default),
    ``--tune-clock`` and ``--fresh``; :func:`check_tuning` refuses the last three beside ``--no-tune``."""
    parser.add_argument("--no-tune", action="store_true", help="only the fixed configuration (spec aBC)")
    parser.add_argument("--tune-seconds", type=seconds("--tune-seconds 20"), default=None, metavar="S",
                        help=budget_help)
    parser.add_argument("--tune-clock", choices=["wall", "cpu"], default=None,
                        help="how the tuner times candidates: cpu leaves out the time other processes held the "
                             "cores (a busy machine); the table is wall clock either way (default wall)")
    parser.add_argument("--fresh", action="store_true",
                        help="tune from nothing: do not resume (or update) the searches earlier runs remembered "
                             "in tppasm's cache")


def check_tuning(parser, args):
    """argparse's error (exit 2) for tuning options beside ``--no-tune``, which would do nothing."""
    given = [flag for flag, on in (("--tune-seconds", args.tune_seconds is not None), ("--fresh", args.fresh),
                                   ("--tune-clock", args.tune_clock is not None)) if on]
    if args.no_tune and given:
        parser.error(f"--no-tune times the fixed configuration alone: {', '.join(given)} would do nothing; "
                     f"drop {'it' if len(given) == 1 else 'them'} or --no-tune")
    args.tune_clock = args.tune_clock or "wall"


def dtypes_option(parser, choices, default=None):
    """Add ``--dtypes D,...`` (checked: each one of ``choices``; default all of them)."""
    default = default or ",".join(choices)
    parser.add_argument("--dtypes", type=names("dtypes", choices, f"--dtypes {choices[0]}"), default=default,
                        metavar="D,...", help=f"comma list out of {', '.join(choices)} (default {default})")


STRIPPED = "(its description is a docstring, which python -OO strips: run python -m bench without -OO to read it)"


def summary(doc):
    """The first paragraph of a module's docstring on one line: a parser's description (argparse
    rewraps it; its first line alone stops mid-sentence); under ``python -OO``, which strips
    docstrings (``doc`` None), a line saying so.

    >>> summary("``python -m bench x``: times\\nthis.\\n\\nMore.")
    '``python -m bench x``: times this.'
    >>> summary(None) == STRIPPED
    True
    """
    if doc is None:
        return STRIPPED
    return " ".join(doc.strip().split("\n\n")[0].split())
