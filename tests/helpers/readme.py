"""The README's "Your own devices" section, as text and as its code blocks, for tests that follow it."""

from pathlib import Path

README = (Path(__file__).resolve().parents[2] / "README.md").read_text()


def own_devices_section() -> str:
    """The text of "Your own devices", up to its task files' subsection."""
    return README[README.index("## Your own devices") : README.index("### Task files")]


def own_devices_blocks() -> list[list[str]]:
    """The code blocks of "Your own devices" (lines indented 4 spaces or more, in a list item or not),
    each a list of lines without the block's indent, a line continued with \\ joined.
    """
    blocks: list[list[str]] = []
    indent = 0  # the current block's, 0 outside a block
    for line in own_devices_section().splitlines():
        own = len(line) - len(line.lstrip(" "))
        if not line.strip() or own < max(indent, 4):
            indent = 0
        elif indent:
            if blocks[-1][-1].endswith("\\"):
                blocks[-1][-1] = blocks[-1][-1][:-1].rstrip() + " " + line.strip()
            else:
                blocks[-1].append(line[indent:])
        else:
            blocks.append([line[own:]])
            indent = own
    return blocks
