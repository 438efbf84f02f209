"""The command line (``rankscope``) and the offline tools behind it: demo, launch,
import (importers/), watch, replay, export, sql."""
