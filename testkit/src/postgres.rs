//! A real, temporary PostgreSQL cluster: `initdb` and `pg_ctl` from the installed
//! binaries, listening on a private Unix socket (and, if asked, on a TCP address of this
//! host), stopped on drop. Where the binaries are missing it [`skip`](crate::skip)s:
//! `SKIPPED` locally, a failure under `CI`.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Where the PostgreSQL server binaries are: PATH, Debian's versioned directories, or
/// what `pg_config --bindir` says.
fn bindir() -> Option<PathBuf> {
    let has = |d: &Path| d.join("initdb").is_file() && d.join("pg_ctl").is_file();
    let mut candidates: Vec<PathBuf> = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect())
        .unwrap_or_default();
    if let Ok(entries) = std::fs::read_dir("/usr/lib/postgresql") {
        let mut versions: Vec<PathBuf> = entries.flatten().map(|e| e.path().join("bin")).collect();
        versions.sort();
        candidates.extend(versions.into_iter().rev());
    }
    if let Ok(out) = Command::new("pg_config").arg("--bindir").output() {
        candidates.push(PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()));
    }
    // /usr/local/bin may hold links to a few of them: use the directory they point into,
    // where psql is too.
    let found = candidates.into_iter().find(|d| has(d))?;
    let real = std::fs::canonicalize(found.join("initdb")).ok()?;
    real.parent().map(Path::to_path_buf)
}

/// Whether the tests run as root (initdb refuses to: the cluster then runs as `postgres`).
fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false)
}

/// A running cluster.
pub struct Cluster {
    dir: tempfile::TempDir,
    bin: PathBuf,
    as_postgres: bool,
    port: u16,
    fsync: bool,
    /// A TCP address to listen on besides the socket (empty: none).
    listen: String,
}

fn run(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?}: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

impl Cluster {
    /// Start one, or `None` (with a loud SKIP) when PostgreSQL is not installed; with
    /// `CI` set, a missing PostgreSQL fails the test instead.
    pub fn start() -> Option<Cluster> {
        Cluster::start_with(false)
    }

    /// [`Cluster::start`], with `fsync` on (the benchmark: commits as durable as the
    /// ledger's) or off (the tests: faster, and no test pulls the power).
    pub fn start_with(fsync: bool) -> Option<Cluster> {
        Cluster::start_inner(fsync, "")
    }

    /// [`Cluster::start`], also listening on TCP at `addr` (an address of this host),
    /// taking the gate's role from the subnets of this host's addresses (`samenet`).
    pub fn start_listening(addr: &str) -> Option<Cluster> {
        Cluster::start_inner(false, addr)
    }

    fn start_inner(fsync: bool, listen: &str) -> Option<Cluster> {
        let Some(bin) = bindir() else {
            crate::skip(
                "no PostgreSQL server binaries (initdb, pg_ctl) on PATH, under /usr/lib/postgresql/*/bin or at `pg_config --bindir`",
                "apt-get install postgresql (.ci/run does)",
            );
            return None;
        };
        let dir = tempfile::tempdir().expect("tempdir");
        let as_postgres = is_root();
        if as_postgres {
            run(Command::new("chown").arg("postgres:").arg(dir.path()));
        }
        // Each cluster its own socket name (only the socket listens: no TCP port).
        let port = 20_000 + (std::process::id() % 20_000) as u16;
        let c = Cluster {
            dir,
            bin,
            as_postgres,
            port,
            fsync,
            listen: listen.to_owned(),
        };
        run(c
            .pg("initdb")
            .args(["-D", &c.data(), "-U", "tally", "--auth=trust", "-E", "UTF8"])
            .arg("--no-sync"));
        if !listen.is_empty() {
            use std::io::Write;
            let hba = Path::new(&c.data()).join("pg_hba.conf");
            let mut f = std::fs::OpenOptions::new()
                .append(true)
                .open(&hba)
                .expect("pg_hba.conf");
            writeln!(f, "host gate gate samenet trust").expect("pg_hba.conf");
        }
        c.pg_ctl_start();
        // The gate's role owns its database and nothing else: no superuser.
        run(c.pg("psql").args([
            "-h",
            &c.socket_dir(),
            "-p",
            &c.port.to_string(),
            "-U",
            "tally",
            "-d",
            "postgres",
            "-v",
            "ON_ERROR_STOP=1",
            "-c",
            "CREATE ROLE gate LOGIN",
            "-c",
            "CREATE DATABASE gate OWNER gate",
        ]));
        Some(c)
    }

    fn pg(&self, tool: &str) -> Command {
        let path = self.bin.join(tool);
        if self.as_postgres {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(path);
            c
        } else {
            Command::new(path)
        }
    }

    fn data(&self) -> String {
        self.dir.path().join("data").display().to_string()
    }

    fn socket_dir(&self) -> String {
        self.dir.path().display().to_string()
    }

    fn pg_ctl_start(&self) {
        let opts = format!(
            "-k {} -c listen_addresses={} -p {} -c fsync={}",
            self.socket_dir(),
            self.listen,
            self.port,
            if self.fsync { "on" } else { "off" }
        );
        let log = self.dir.path().join("log").display().to_string();
        run(self
            .pg("pg_ctl")
            .args(["-D", &self.data(), "-l", &log, "-o", &opts, "-w", "start"]));
    }

    /// Stop the server (fast: open connections are cut).
    pub fn stop(&self) {
        run(self
            .pg("pg_ctl")
            .args(["-D", &self.data(), "-m", "fast", "-w", "stop"]));
    }

    /// Start it again after [`Cluster::stop`].
    pub fn restart(&self) {
        self.pg_ctl_start();
    }

    /// The connection string for the gate's role.
    pub fn url(&self) -> String {
        format!(
            "host={} port={} user=gate dbname=gate",
            self.socket_dir(),
            self.port
        )
    }

    /// The connection string for the gate's role over TCP (see
    /// [`Cluster::start_listening`]).
    pub fn tcp_url(&self) -> String {
        format!(
            "host={} port={} user=gate dbname=gate",
            self.listen, self.port
        )
    }

    /// Run SQL as the gate's role (for the test's own inspection).
    pub fn psql(&self, sql: &str) -> String {
        self.psql_as("gate", "gate", sql)
    }

    /// A database owned by the gate's role (created by the cluster's superuser).
    pub fn create_database(&self, name: &str) {
        self.psql_as(
            "tally",
            "postgres",
            &format!("CREATE DATABASE {name} OWNER gate"),
        );
    }

    fn psql_as(&self, user: &str, db: &str, sql: &str) -> String {
        run(self.pg("psql").args([
            "-h",
            &self.socket_dir(),
            "-p",
            &self.port.to_string(),
            "-U",
            user,
            "-d",
            db,
            "-At",
            "-v",
            "ON_ERROR_STOP=1",
            "-c",
            sql,
        ]))
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = self
            .pg("pg_ctl")
            .args(["-D", &self.data(), "-m", "immediate", "-w", "stop"])
            .output();
    }
}
