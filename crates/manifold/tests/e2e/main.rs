//! The gateway end to end, as one test binary: real `manifold` and
//! `manifold-fixture` processes on loopback, real clients, real stores. One
//! binary instead of one per file, because each link pulls in the whole
//! gateway (see the CI budget in ARCHITECTURE.md).

mod common;

mod admin_cli;
mod admission;
mod attacks;
mod audit_bounds;
mod audit_failure;
mod browser;
mod code_mode;
mod console;
mod console_forms;
mod direct_proxy;
mod export;
mod fast_call;
mod gateway_tasks;
mod governed;
mod hostile;
mod load;
mod one_door;
mod operator;
mod ops;
mod overrides;
mod replicas;
mod request_path;
mod search;
mod spine;
mod tasks;
mod traces;
