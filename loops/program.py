"""The traced program of a loop body: its kernel calls (:class:`Call`) and the tree of the ``if``
decisions between them (:class:`Node`), which the nest generators compile and the race analysis
reads. :func:`loops.trace.trace` builds it, one path per outcome of the decisions, merged here.

>>> root = merge_paths([[("call", "zero(C)", None)]])
>>> root.calls, root.test is None
(['zero(C)'], True)
"""
from dataclasses import dataclass, field


@dataclass
class Call:
    """One kernel call: args are (argument index, element offset) per operand."""

    kernel: object
    args: tuple
    scalars: tuple
    text: str
    checks: tuple         # (affine, lo, hi, message): lo <= affine <= hi must hold where called
    path: tuple           # (Compare, outcome) decisions that lead here
    boxes: tuple = ()     # per operand, per axis of its argument: (start, extent, step) (View.box)


@dataclass
class Node:
    """Calls in order, then optionally a branch on ``test``: (then-node, else-node)."""

    calls: list = field(default_factory=list)
    test: object = None   # a loops.affine.Compare
    then: "Node" = None
    other: "Node" = None

    def simplify(self, box):
        """Drop branches whose test is decided over ``box`` (var -> (lo, hi) inclusive); returns a Node.

        >>> from loops.affine import Affine, Compare
        >>> i = Affine((("a", 1),))
        >>> n = Node([], Compare(i, "=="), Node(["then"]), Node(["else"]))
        >>> n.simplify({"a": (0, 0)}).calls, n.simplify({"a": (0, 3)}).test is not None
        (['then'], True)
        """
        if self.test is None:
            return Node(list(self.calls))
        lo, hi = self.test.expr.bounds(box)
        sure = {"==": (lo == hi == 0, lo > 0 or hi < 0), "!=": (lo > 0 or hi < 0, lo == hi == 0),
                "<": (hi < 0, lo >= 0), "<=": (hi <= 0, lo > 0), ">": (lo > 0, hi <= 0),
                ">=": (lo >= 0, hi < 0)}[self.test.op]
        if sure[0] or sure[1]:
            rest = (self.then if sure[0] else self.other).simplify(box)
            return Node(list(self.calls) + rest.calls, rest.test, rest.then, rest.other)
        return Node(list(self.calls), self.test, self.then.simplify(box), self.other.simplify(box))

    def all_calls(self):
        yield from self.calls
        if self.test is not None:
            yield from self.then.all_calls()
            yield from self.other.all_calls()

    def pretty(self, indent=""):
        lines = [indent + c.text for c in self.calls]
        if self.test is not None:
            lines.append(f"{indent}if {self.test!r}:")
            lines.append(self.then.pretty(indent + "  ") or indent + "  pass")
            lines.append(f"{indent}else:")
            lines.append(self.other.pretty(indent + "  ") or indent + "  pass")
        return "\n".join(lines)


def merge_paths(paths):
    """Build the tree: each node's calls come from the first path that reaches it."""
    root = Node()
    for events in paths:
        node, fresh = root, not getattr(root, "_filled", False)
        for kind, a, b in events:
            if kind == "call":
                if fresh:
                    node.calls.append(a)
            else:
                node._filled = True
                if node.test is None:
                    node.test, node.then, node.other = a, Node(), Node()
                node = node.then if b else node.other
                fresh = not getattr(node, "_filled", False)
        node._filled = True
    return root
