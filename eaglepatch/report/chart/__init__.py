"""The report's charts, SVG by hand or PNG through matplotlib: ``draw`` (the scene, its two writers, text
metrics, axes, legend: the primitives every chart uses, the sweep's in ``eaglepatch.tuning.sweep_chart`` too),
``compare`` (``report --compare --chart``) and ``predict`` (``report --predict --chart``).

Import the module you need (``from eaglepatch.report.chart.compare import write_compare_chart``): nothing is
re-exported here, so that each chart loads alone.
"""
