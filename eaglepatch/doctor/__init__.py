"""``eaglepatch doctor TARGET``: from the numbers to the fix.

Reads what is there without changing anything (the server's command line, environment and log; its
``/server_info``; the models' config.json; the timing records of its processes; the sweeps of it kept on this
machine; the GPUs and their topology) and names the known mistakes that make speculative decoding slow, each with
its evidence and the next step to take. docs/doctor.md lists every finding with its condition and thresholds.

- ``facts``: ``ServerFacts`` (what was read about one server) and the pure parsers (log lines, flags, configs,
  ``nvidia-smi``);
- ``finding``: ``Finding``, what a rule returns;
- ``rules``: one small named function per finding, its condition and thresholds in its docstring (by kind of
  finding: ``draft``, ``steps``, ``pace``, ``measurement``; the thresholds in ``thresholds``); ``diagnose``;
- ``collect``: reading a target (one request on the host: ``op_doctor`` in hostside/doctor.py) into facts, and the
  ``doctor --json`` document;
- ``render``: the text for people.
"""

from eaglepatch.doctor.facts import ServerFacts, evidence
from eaglepatch.doctor.finding import SEVERITIES, Finding
from eaglepatch.doctor.rules import RULES, diagnose

__all__ = ["RULES", "SEVERITIES", "Finding", "ServerFacts", "diagnose", "evidence"]
