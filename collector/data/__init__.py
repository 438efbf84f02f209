"""The data contract every part shares: the tables' schema, the data dir's layout and
run ids, the wire codec, the catalog's views (and the one definition of a collective
instance), configuration blocks, and the token/TLS helpers. Never torch, never the
server. Import the submodule you need: the rank side loads schema/codec/layout/config/
security only, never catalog (duckdb)."""
