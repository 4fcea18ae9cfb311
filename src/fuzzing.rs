//! Entry points for the fuzz targets in `fuzz/` and the corpus replay tests: each takes
//! arbitrary bytes and runs one of the engine's decoders on them. Not an API: hidden from the
//! docs and free to change with the fuzz targets.
