"""Models through one hooked interface: loading, native HF modules, the one collector (``collect``), prefix replay,
edit operators and hook sites. Imports ``core`` only."""
