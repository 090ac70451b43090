//! The config file's `[[servers]]`, as the admin API and the console change
//! them. This crate does not know the config format: the `manifold` binary
//! owns it and hands the gateway a [`ServerFile`] that edits the file with
//! the same code as `manifold servers add|remove` (comments kept, the result
//! loaded before it is written) and then applies it through its reload, so
//! the server runs, or stops, before the request is answered, and stays that
//! way after a restart.

use futures::future::BoxFuture;

use super::ops::AdminError;

/// A server to write into the config file; checked by
/// [`super::ops::add_server`] before it gets here.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerEntry {
    pub name: String,
    pub description: String,
    /// A stdio server's command, or else `url`.
    pub command: Option<String>,
    pub args: Vec<String>,
    pub url: Option<String>,
    /// Written only when false (true is the default).
    pub autoconnect: bool,
}

/// The gateway's own config file. Each replica has its own, so a change here
/// reaches this replica only.
pub trait ServerFile: Send + Sync {
    /// Appends the server and applies the file. `Conflict` when the file
    /// already names it, `Invalid` when the result would not load.
    fn add(&self, server: ServerEntry) -> BoxFuture<'_, Result<(), AdminError>>;
    /// Removes the server and applies the file. `NotFound` when the file
    /// does not name it.
    fn remove<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<(), AdminError>>;
}
