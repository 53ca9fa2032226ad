"""Fail a worker image build when an installed package is missing or differs from its pin.

Run as the last step of docker/Dockerfile.*-worker with the image's constraints file, so a
resolver that quietly moved a pin fails the build rather than the first run on the cluster.
"""

import sys
from importlib.metadata import PackageNotFoundError, version

from packaging.requirements import Requirement


def main(path: str) -> None:
    wrong: dict[str, str | None] = {}
    with open(path, encoding="utf-8") as lines:
        text = lines.read()
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        req = Requirement(line)
        try:
            have: str | None = version(req.name)
        except PackageNotFoundError:
            have = None
        # A local label (torch 2.10.0+cpu) is the same release as its pin.
        if have is None or have.split("+", 1)[0] not in req.specifier:
            wrong[req.name] = have
    if wrong:
        sys.exit(f"installed versions differ from the pins in {path}: {wrong}")


if __name__ == "__main__":
    main(sys.argv[1])
