//! Tool retrieval over the catalog: BM25F and regex strategies.
