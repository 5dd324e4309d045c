"""The code that runs ON the target host: scan /proc for the sglang servers, stop and start them, probe their
readiness, read an install's facts, take its lock, carry out a plan, read the timing logs, and doctor's reads.

An ordinary package with real imports between its modules, tested here like any other code; on the host it runs as
one program that ``eaglepatch.hosts.bundle`` makes of it, in the agent's interpreter (``eaglepatch.hosts.agent``),
which calls ``main.main(payload)`` once per request. So every module here is standard library only, runs on
Python 3.8+, imports nothing outside this package (the bundler refuses a module that does), and never imports
sglang (importing it takes seconds and may need a GPU).
"""
