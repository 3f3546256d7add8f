"""No two modules of the project import each other, directly or around a longer loop, counting the
imports inside functions (a function-level import that dodges a circle is still one). A type-only
import (`if TYPE_CHECKING:`) is not an import at run time and does not count."""
from __future__ import annotations

import grimp

PACKAGES = ("storage", "models", "tasks", "flows")


def import_cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index, low, on_stack, stack, found = {}, {}, set(), [], []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges.get(root, ()))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_finder_finds_a_loop_and_passes_a_chain():
    assert import_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert import_cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


def test_no_module_of_the_project_imports_itself_around_a_loop():
    graph = grimp.build_graph(*PACKAGES, exclude_type_checking_imports=True, cache_dir=None)  # no stale cache
    edges = {module: graph.find_modules_directly_imported_by(module) for module in graph.modules}
    assert import_cycles(edges) == [], "modules that import each other: move what both need below them"
