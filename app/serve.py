"""What ``python -m app`` runs: the dashboard (main.py) as a Streamlit ASGI app whose page shell
starts loading Plotly at once (preload.PlotlyEarly; issue 48)."""

from pathlib import Path

import streamlit as st
from starlette.middleware import Middleware

from app.preload import PlotlyEarly

app = st.App(Path(__file__).with_name("main.py"), middleware=[Middleware(PlotlyEarly)])
