"""verl's ``verl.plugins`` entry point. verl imports it at ``import verl`` and calls nothing
(``EntryPoint.load()`` only imports), so importing this module is what registers and shims."""

from jobs.verl_cpu.plugin import load

load()
