//! Process isolation for the code-mode sandbox worker.
//!
//! The JS engine exposes no I/O of its own; these layers are defence in depth
//! against an engine bug. Each layer is reported, active or not with the
//! reason, so that a weaker sandbox is never silent. [`isolate`] must run
//! while the worker is still single-threaded: `unshare(CLONE_NEWUSER)`
//! refuses multithreaded callers, and Landlock and seccomp bind only the
//! calling thread.

use serde::{Deserialize, Serialize};

/// Which layers [`isolate`] applies. The environment check, the rlimits and
/// `no_new_privs` are always applied.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(default)]
pub struct IsolationConfig {
    /// A new user and network namespace: no interfaces but a down loopback.
    pub network_namespace: bool,
    /// Landlock: every filesystem right handled, no path allowed.
    pub landlock: bool,
    /// Seccomp allow-list of the syscalls the worker needs once isolated.
    pub seccomp: bool,
    /// `RLIMIT_AS`, if any.
    pub max_address_space_bytes: Option<u64>,
}

impl Default for IsolationConfig {
    fn default() -> Self {
        IsolationConfig {
            network_namespace: true,
            landlock: true,
            seccomp: true,
            max_address_space_bytes: Some(2 << 30),
        }
    }
}

/// One isolation layer and whether it took effect.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Layer {
    pub name: String,
    pub active: bool,
    pub detail: String,
}

impl Layer {
    fn new(name: &str, active: bool, detail: impl Into<String>) -> Layer {
        Layer {
            name: name.to_string(),
            active,
            detail: detail.into(),
        }
    }

    fn disabled(name: &str) -> Layer {
        Layer::new(name, false, DISABLED)
    }
}

/// Detail of a layer turned off in [`IsolationConfig`].
pub const DISABLED: &str = "disabled by configuration";

/// What [`isolate`] did, layer by layer, in the order applied.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct IsolationReport {
    pub layers: Vec<Layer>,
}

impl IsolationReport {
    pub fn inactive(&self) -> Vec<&Layer> {
        self.layers.iter().filter(|l| !l.active).collect()
    }

    pub fn all_active(&self) -> bool {
        self.layers.iter().all(|l| l.active)
    }

    pub fn layer(&self, name: &str) -> Option<&Layer> {
        self.layers.iter().find(|l| l.name == name)
    }

    pub fn is_active(&self, name: &str) -> bool {
        self.layer(name).is_some_and(|l| l.active)
    }
}

/// One check, from inside the sandbox, that something is refused.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Probe {
    pub name: String,
    pub blocked: bool,
    pub detail: String,
}

impl Probe {
    fn new(name: &str, blocked: bool, detail: impl Into<String>) -> Probe {
        Probe {
            name: name.to_string(),
            blocked,
            detail: detail.into(),
        }
    }
}

/// Applies every enabled layer to the current process. Must run while the
/// process is single-threaded. Never panics; a refused layer is reported
/// inactive with the kernel's error.
pub fn isolate(config: &IsolationConfig) -> IsolationReport {
    // Before the user namespace, where our uid reads as the overflow uid.
    let root = imp::is_root();
    let mut layers = vec![clean_environment()];
    layers.push(if config.network_namespace {
        imp::network_namespace()
    } else {
        Layer::disabled("network_namespace")
    });
    // Before the rlimits: creating the ruleset needs a file descriptor.
    layers.push(if config.landlock {
        imp::landlock()
    } else {
        Layer::disabled("landlock")
    });
    layers.push(imp::rlimits(config.max_address_space_bytes, root));
    layers.push(imp::no_new_privs());
    // Last: the filter would refuse the calls the other layers make.
    layers.push(if config.seccomp {
        imp::seccomp()
    } else {
        Layer::disabled("seccomp")
    });
    IsolationReport { layers }
}

fn clean_environment() -> Layer {
    let names: Vec<String> = std::env::vars_os()
        .map(|(k, _)| k.to_string_lossy().into_owned())
        .collect();
    if names.is_empty() {
        Layer::new("clean_environment", true, "environment is empty")
    } else {
        Layer::new(
            "clean_environment",
            false,
            format!(
                "{} variable(s) inherited: {}",
                names.len(),
                names.join(", ")
            ),
        )
    }
}

/// Checks, from inside, that the sandbox holds. Each probe is `blocked` when
/// the attempt failed; a probe that succeeded cleans up after itself.
pub fn probe() -> Vec<Probe> {
    let mut probes = imp::probes();
    let count = std::env::vars_os().count();
    probes.push(Probe::new(
        "environment_empty",
        count == 0,
        format!("{count} variable(s)"),
    ));
    probes
}

#[cfg(target_os = "linux")]
mod imp {
    use super::{Layer, Probe};
    use std::collections::BTreeMap;
    use std::io::Error;

    fn errno_text(what: &str) -> String {
        format!("{what}: {}", Error::last_os_error())
    }

    pub(super) fn network_namespace() -> Layer {
        const NAME: &str = "network_namespace";
        // SAFETY: unshare takes flags only.
        if unsafe { libc::unshare(libc::CLONE_NEWUSER | libc::CLONE_NEWNET) } == 0 {
            return Layer::new(
                NAME,
                true,
                "unshare(CLONE_NEWUSER | CLONE_NEWNET): new network namespace, loopback down, no other interface",
            );
        }
        let with_user = errno_text("unshare(CLONE_NEWUSER | CLONE_NEWNET)");
        // User namespaces may be forbidden (sysctl, AppArmor) where a
        // privileged worker can still take a network namespace alone.
        // SAFETY: as above.
        if unsafe { libc::unshare(libc::CLONE_NEWNET) } == 0 {
            return Layer::new(
                NAME,
                true,
                format!(
                    "{with_user}; unshare(CLONE_NEWNET) alone succeeded: new network namespace, loopback down"
                ),
            );
        }
        Layer::new(NAME, false, with_user)
    }

    pub(super) fn landlock() -> Layer {
        use landlock::{
            ABI, Access, AccessFs, AccessNet, Ruleset, RulesetAttr, RulesetStatus, Scope,
        };
        const NAME: &str = "landlock";
        const LANDLOCK_CREATE_RULESET_VERSION: libc::c_uint = 1;

        // Ask the kernel for its ABI, so that the ruleset handles exactly
        // what it knows and the status reads "fully" when all of it holds.
        // SAFETY: a null attribute with size 0 and the VERSION flag is the
        // documented version query.
        let version = unsafe {
            libc::syscall(
                libc::SYS_landlock_create_ruleset,
                std::ptr::null::<libc::c_void>(),
                0usize,
                LANDLOCK_CREATE_RULESET_VERSION,
            )
        };
        if version < 0 {
            let err = Error::last_os_error();
            let why = match err.raw_os_error() {
                Some(libc::ENOSYS) => "Landlock is not built into this kernel",
                Some(libc::EOPNOTSUPP) => "Landlock is built in but not enabled at boot (lsm=)",
                _ => "Landlock version query failed",
            };
            return Layer::new(
                NAME,
                false,
                format!("not supported by the kernel: {why} ({err})"),
            );
        }
        let abi = ABI::from(version as i32);
        let fs = AccessFs::from_all(abi);
        let net = AccessNet::from_all(abi);
        let scopes = Scope::from_all(abi);

        let result = (|| {
            let mut ruleset = Ruleset::default().handle_access(fs)?;
            if !net.is_empty() {
                ruleset = ruleset.handle_access(net)?;
            }
            if !scopes.is_empty() {
                ruleset = ruleset.scope(scopes)?;
            }
            // No rules: nothing beneath any path is allowed.
            ruleset.create()?.restrict_self()
        })();
        let status = match result {
            Ok(status) => status,
            Err(e) => return Layer::new(NAME, false, format!("ruleset refused: {e}")),
        };
        let (active, enforced) = match status.ruleset {
            RulesetStatus::FullyEnforced => (true, "fully enforced"),
            RulesetStatus::PartiallyEnforced => (true, "partially enforced"),
            RulesetStatus::NotEnforced => (false, "not enforced"),
        };
        Layer::new(
            NAME,
            active,
            format!(
                "{enforced} (kernel ABI {version}, crate uses {abi:?}): {} filesystem rights handled with no path rules, {} network rights, {} scopes",
                fs.len(),
                net.len(),
                scopes.len()
            ),
        )
    }

    pub(super) fn is_root() -> bool {
        // SAFETY: getuid cannot fail.
        unsafe { libc::getuid() == 0 }
    }

    pub(super) fn rlimits(max_address_space: Option<u64>, root: bool) -> Layer {
        let mut limits: Vec<(&str, libc::__rlimit_resource_t, u64)> = vec![
            ("CORE", libc::RLIMIT_CORE, 0),
            // stdin, stdout and stderr are open already; a few spare.
            ("NOFILE", libc::RLIMIT_NOFILE, 16),
            // Counted per user: not enforced for root, but free elsewhere.
            ("NPROC", libc::RLIMIT_NPROC, 0),
        ];
        // FSIZE also binds files already open: a worker whose stderr is the
        // gateway's log file would die of SIGXFSZ on its first write.
        let regular = regular_file_stdio();
        if regular.is_empty() {
            limits.push(("FSIZE", libc::RLIMIT_FSIZE, 0));
        }
        if let Some(bytes) = max_address_space {
            limits.push(("AS", libc::RLIMIT_AS, bytes));
        }
        let mut set = Vec::new();
        let mut failed = Vec::new();
        for (name, resource, value) in limits {
            let limit = libc::rlimit {
                rlim_cur: value,
                rlim_max: value,
            };
            // SAFETY: a valid resource and a pointer to a live rlimit.
            if unsafe { libc::setrlimit(resource, &limit) } == 0 {
                set.push(format!("{name}={value}"));
            } else {
                failed.push(errno_text(&format!("RLIMIT_{name}")));
            }
        }
        if root {
            set.push("(NPROC is not enforced for root)".to_string());
        }
        if !regular.is_empty() {
            set.push(format!(
                "(FSIZE not limited: fd {} is a regular file)",
                regular.join(", ")
            ));
        }
        let mut detail = set.join(" ");
        if !failed.is_empty() {
            detail = format!("{detail}; failed: {}", failed.join("; "));
        }
        Layer::new("rlimits", failed.is_empty(), detail)
    }

    fn regular_file_stdio() -> Vec<String> {
        (0..=2)
            .filter(|&fd| {
                // SAFETY: an all-zero stat is valid; fstat only writes it.
                let mut st: libc::stat = unsafe { std::mem::zeroed() };
                // SAFETY: st is a live stat buffer.
                let ok = unsafe { libc::fstat(fd, &mut st) } == 0;
                ok && st.st_mode & libc::S_IFMT == libc::S_IFREG
            })
            .map(|fd| fd.to_string())
            .collect()
    }

    pub(super) fn no_new_privs() -> Layer {
        const NAME: &str = "no_new_privs";
        // SAFETY: prctl with integer arguments only.
        if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } != 0 {
            return Layer::new(NAME, false, errno_text("prctl(PR_SET_NO_NEW_PRIVS)"));
        }
        // SAFETY: as above.
        match unsafe { libc::prctl(libc::PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0) } {
            1 => Layer::new(NAME, true, "PR_SET_NO_NEW_PRIVS set"),
            _ => Layer::new(
                NAME,
                false,
                errno_text("PR_GET_NO_NEW_PRIVS does not read 1"),
            ),
        }
    }

    /// The syscalls the isolated worker may make; everything else fails
    /// with EPERM. Returned for the report and the tests.
    pub fn seccomp_allow_list() -> Vec<(&'static str, i64)> {
        macro_rules! calls {
            ($($name:ident),* $(,)?) => {
                vec![$((stringify!($name), libc::$name as i64)),*]
            };
        }
        let mut calls = calls![
            // I/O on the pipes already open.
            SYS_read,
            SYS_readv,
            SYS_write,
            SYS_writev,
            SYS_ppoll,
            SYS_close,
            SYS_fstat,
            SYS_newfstatat,
            SYS_statx,
            SYS_lseek,
            // Memory: mmap and mprotect are checked against PROT_EXEC below.
            SYS_mmap,
            SYS_mprotect,
            SYS_munmap,
            SYS_mremap,
            SYS_brk,
            SYS_madvise,
            // Locks, time, randomness.
            SYS_futex,
            SYS_clock_gettime,
            SYS_clock_getres,
            SYS_clock_nanosleep,
            SYS_gettimeofday,
            SYS_getrandom,
            SYS_sched_yield,
            // Signals, the abort path and exit.
            SYS_rt_sigreturn,
            SYS_rt_sigprocmask,
            SYS_rt_sigaction,
            SYS_sigaltstack,
            SYS_restart_syscall,
            SYS_getpid,
            SYS_gettid,
            SYS_tgkill,
            SYS_exit,
            SYS_exit_group,
        ];
        #[cfg(target_arch = "x86_64")]
        calls.extend(calls![SYS_poll]);
        calls
    }

    fn seccomp_program() -> Result<seccompiler::BpfProgram, String> {
        use seccompiler::{
            SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
            SeccompRule, TargetArch,
        };
        let arch = TargetArch::try_from(std::env::consts::ARCH).map_err(|e| e.to_string())?;
        // Both checked arguments are C ints: compare the low 32 bits.
        let cond = |arg, op, value| SeccompCondition::new(arg, SeccompCmpArgLen::Dword, op, value);
        let no_exec = || cond(2, SeccompCmpOp::MaskedEq(libc::PROT_EXEC as u64), 0);
        // SAFETY: getpid cannot fail.
        let pid = unsafe { libc::getpid() } as u64;

        let mut rules: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
        for (name, nr) in seccomp_allow_list() {
            let conditions = match name {
                // No executable memory: QuickJS has no JIT.
                "SYS_mmap" | "SYS_mprotect" => vec![no_exec().map_err(|e| e.to_string())?],
                // Signals to this process only (abort raises SIGABRT).
                "SYS_tgkill" => vec![cond(0, SeccompCmpOp::Eq, pid).map_err(|e| e.to_string())?],
                _ => Vec::new(),
            };
            let chain = if conditions.is_empty() {
                Vec::new()
            } else {
                vec![SeccompRule::new(conditions).map_err(|e| e.to_string())?]
            };
            rules.insert(nr, chain);
        }
        let filter = SeccompFilter::new(
            rules,
            SeccompAction::Errno(libc::EPERM as u32),
            SeccompAction::Allow,
            arch,
        )
        .map_err(|e| e.to_string())?;
        seccompiler::BpfProgram::try_from(filter).map_err(|e| e.to_string())
    }

    pub(super) fn seccomp() -> Layer {
        const NAME: &str = "seccomp";
        let program = match seccomp_program() {
            Ok(p) => p,
            Err(e) => return Layer::new(NAME, false, format!("filter not built: {e}")),
        };
        match seccompiler::apply_filter(&program) {
            Ok(()) => {
                let names: Vec<&str> = seccomp_allow_list()
                    .into_iter()
                    .map(|(n, _)| n.trim_start_matches("SYS_"))
                    .collect();
                Layer::new(
                    NAME,
                    true,
                    format!(
                        "allow-list of {} syscalls, everything else EPERM; mmap/mprotect without PROT_EXEC, tgkill to own pid: {}",
                        names.len(),
                        names.join(" ")
                    ),
                )
            }
            Err(e) => Layer::new(NAME, false, format!("filter refused: {e}")),
        }
    }

    pub(super) fn probes() -> Vec<Probe> {
        vec![
            tcp_connect(),
            read_file("read_etc_passwd", c"/etc/passwd"),
            read_file("read_proc_self_environ", c"/proc/self/environ"),
            create_in_tmp(),
            fork(),
            spawn(),
            exec_memory(),
        ]
    }

    fn tcp_connect() -> Probe {
        const NAME: &str = "tcp_connect_127.0.0.1";
        // SAFETY: plain socket creation.
        let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
        if fd < 0 {
            return Probe::new(NAME, true, errno_text("socket(AF_INET, SOCK_STREAM)"));
        }
        let addr = libc::sockaddr_in {
            sin_family: libc::AF_INET as libc::sa_family_t,
            // Port 9: nothing listens, so a reachable host answers ECONNREFUSED.
            sin_port: 9u16.to_be(),
            sin_addr: libc::in_addr {
                s_addr: u32::from(std::net::Ipv4Addr::LOCALHOST).to_be(),
            },
            sin_zero: [0; 8],
        };
        // SAFETY: addr is a live sockaddr_in of the given size.
        let rc = unsafe {
            libc::connect(
                fd,
                (&addr as *const libc::sockaddr_in).cast(),
                size_of::<libc::sockaddr_in>() as libc::socklen_t,
            )
        };
        let err = Error::last_os_error();
        // SAFETY: fd is ours.
        unsafe { libc::close(fd) };
        match (rc, err.raw_os_error()) {
            (0, _) => Probe::new(NAME, false, "connected"),
            // Refused means the loopback is up and reachable: not blocked.
            (_, Some(libc::ECONNREFUSED)) => Probe::new(
                NAME,
                false,
                format!("socket opened, loopback reachable: {err}"),
            ),
            _ => Probe::new(NAME, true, format!("socket opened, connect failed: {err}")),
        }
    }

    fn read_file(name: &str, path: &std::ffi::CStr) -> Probe {
        // SAFETY: path is a valid C string.
        let fd = unsafe { libc::open(path.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) };
        if fd < 0 {
            return Probe::new(name, true, errno_text(&format!("open({path:?})")));
        }
        let mut buf = [0u8; 64];
        // SAFETY: buf is writable for its length.
        let n = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
        // SAFETY: fd is ours.
        unsafe { libc::close(fd) };
        Probe::new(name, false, format!("opened and read {n} bytes"))
    }

    fn create_in_tmp() -> Probe {
        const NAME: &str = "create_file_in_tmp";
        // SAFETY: getpid cannot fail.
        let path = format!("/tmp/manifold-isolation-probe-{}\0", unsafe {
            libc::getpid()
        });
        // SAFETY: path is NUL-terminated.
        let fd = unsafe {
            libc::open(
                path.as_ptr().cast(),
                libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_CLOEXEC,
                0o600,
            )
        };
        if fd < 0 {
            return Probe::new(NAME, true, errno_text("open(/tmp/..., O_CREAT)"));
        }
        // SAFETY: fd is ours, path NUL-terminated.
        unsafe {
            libc::close(fd);
            libc::unlink(path.as_ptr().cast());
        }
        Probe::new(NAME, false, "created (and removed)")
    }

    fn fork() -> Probe {
        const NAME: &str = "fork";
        // SAFETY: the child only calls _exit.
        match unsafe { libc::fork() } {
            -1 => Probe::new(NAME, true, errno_text("fork")),
            0 => unsafe { libc::_exit(0) },
            pid => {
                let mut status = 0;
                // SAFETY: pid is our child.
                unsafe { libc::waitpid(pid, &mut status, 0) };
                Probe::new(NAME, false, format!("forked pid {pid}"))
            }
        }
    }

    fn exec_memory() -> Probe {
        const NAME: &str = "mmap_executable";
        // SAFETY: a fresh anonymous mapping, unmapped right away.
        let addr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                4096,
                libc::PROT_READ | libc::PROT_EXEC,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if addr == libc::MAP_FAILED {
            return Probe::new(NAME, true, errno_text("mmap(PROT_EXEC)"));
        }
        // SAFETY: the mapping above.
        unsafe { libc::munmap(addr, 4096) };
        Probe::new(NAME, false, "mapped")
    }

    fn spawn() -> Probe {
        const NAME: &str = "spawn_process";
        match std::process::Command::new("/bin/true")
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
        {
            Ok(mut child) => {
                let status = child.wait();
                Probe::new(NAME, false, format!("/bin/true ran: {status:?}"))
            }
            Err(e) => Probe::new(NAME, true, format!("spawn /bin/true: {e}")),
        }
    }
}

#[cfg(target_os = "linux")]
pub use imp::seccomp_allow_list;

#[cfg(not(target_os = "linux"))]
mod imp {
    use super::{Layer, Probe};

    const UNSUPPORTED: &str = "not supported on this operating system";

    pub(super) fn network_namespace() -> Layer {
        Layer::new("network_namespace", false, UNSUPPORTED)
    }
    pub(super) fn landlock() -> Layer {
        Layer::new("landlock", false, UNSUPPORTED)
    }
    pub(super) fn is_root() -> bool {
        false
    }
    pub(super) fn rlimits(_: Option<u64>, _: bool) -> Layer {
        Layer::new("rlimits", false, UNSUPPORTED)
    }
    fn regular_file_stdio() -> Vec<String> {
        (0..=2)
            .filter(|&fd| {
                // SAFETY: an all-zero stat is valid; fstat only writes it.
                let mut st: libc::stat = unsafe { std::mem::zeroed() };
                // SAFETY: st is a live stat buffer.
                unsafe { libc::fstat(fd, &mut st) == 0 }
                &&st.st_mode & libc::S_IFMT == libc::S_IFREG
            })
            .map(|fd| fd.to_string())
            .collect()
    }

    pub(super) fn no_new_privs() -> Layer {
        Layer::new("no_new_privs", false, UNSUPPORTED)
    }
    pub(super) fn seccomp() -> Layer {
        Layer::new("seccomp", false, UNSUPPORTED)
    }
    pub(super) fn probes() -> Vec<Probe> {
        Vec::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_enable_every_layer() {
        let config = IsolationConfig::default();
        assert!(config.network_namespace && config.landlock && config.seccomp);
        assert_eq!(config.max_address_space_bytes, Some(2 * 1024 * 1024 * 1024));
        let partial: IsolationConfig = serde_json::from_str(r#"{"seccomp": false}"#).unwrap();
        assert!(!partial.seccomp && partial.landlock);
    }

    #[test]
    fn disabled_layers_are_reported_inactive() {
        let layer = Layer::disabled("landlock");
        assert!(!layer.active);
        assert_eq!(layer.detail, "disabled by configuration");
        let report = IsolationReport {
            layers: vec![Layer::new("rlimits", true, "ok"), layer.clone()],
        };
        assert!(!report.all_active());
        assert_eq!(report.inactive(), vec![&layer]);
        assert!(report.is_active("rlimits") && !report.is_active("landlock"));
    }
}
