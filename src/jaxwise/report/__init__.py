"""Reports in the browser: one self-contained HTML page per run, and per ``watch``.

``jaxwise report RUN_DIR`` writes ``RUN_DIR/report.html``: the training and validation
curves (inline SVG drawn from ``metrics.jsonl``), compile counts and times, the guarantees
checked at run time, DP ε and the audit's lower bound, the top suspected label errors, the
findings of a ``watch.json`` there, the job's plots (embedded PNGs) and the run's
configuration. ``jaxwise watch --html FILE SCRIPT`` writes the watch report the same way.
A page has no script and loads nothing from the network: it opens offline, as one file.

Modules: ``_collect`` (reading a run directory, strictly), ``_svg`` (the charts), ``_page``
(the shared page and its style), ``_html`` (the run report), ``_watch_html`` (the watch
report), ``_write`` (writing a page: atomic, never over a file that is not a report).
"""

from jaxwise.report._write import run_report_html as run_report_html
from jaxwise.report._write import watch_report_html as watch_report_html
from jaxwise.report._write import write_run_report as write_run_report
from jaxwise.report._write import write_watch_report as write_watch_report

__all__ = ["run_report_html", "watch_report_html", "write_run_report", "write_watch_report"]
