"""The command line (``rankscope``: cli puts together commands/, one module per command) and the
offline tools behind it: demo, launch, import (importers/), watch, replay, export, sql, health,
profile, simulate/."""
