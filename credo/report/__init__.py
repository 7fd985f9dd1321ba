"""Run report readable without TensorBoard: PNG plots plus a self-contained ``report.html``.

    from credo.report import write_report
    write_report("runs/my_run")   # -> runs/my_run/report.html, plots in runs/my_run/plots/
"""
from credo.report.page import write_report

__all__ = ["write_report"]
