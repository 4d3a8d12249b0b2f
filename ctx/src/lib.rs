//! ctx (being written)
