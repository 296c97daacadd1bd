/* SPDX-License-Identifier: MIT */
/*
 * The supervisor: a small process that owns the FUSE connection (the
 * /dev/fuse fd) and runs the serving daemon on it as a child. When the
 * daemon dies, the connection stays up; a new daemon continues on it and
 * the kernel resends what was in flight (FUSE_NOTIFY_RESEND). Readers see
 * a stall, never an error. docs/RELIABILITY.md ("Restarts") tells the rest.
 */
#include <errno.h>
#include <fcntl.h>
#include <linux/fuse.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <libgen.h>
#include <limits.h>
#include <unistd.h>

#include "fs.h"

/* Not in older <linux/fuse.h>: Linux >= 6.9 requeues the requests a dead
 * daemon had read but not answered. */
#define SV_NOTIFY_RESEND 7

#define SV_INIT_MAX (1u << 20) /* > any FUSE_INIT; the kernel wants room */
#define SV_MAX_FAILURES 5 /* consecutive failures before giving up */
#define SV_STABLE_S 10 /* a daemon up this long resets the count */
#define SV_WATCH_MS 1000 /* how often the serving daemon is looked at */
#define SV_DYING_S 2.0 /* main thread gone this long: taken for dead */
#define SV_RETIRE_S 5.0 /* a retired daemon's requests resent after */

struct sv {
	struct fuse_session *se;
	int fd; /* the FUSE connection */
	int init_fd; /* memfd: the kernel's FUSE_INIT request, verbatim */
	int pt_fd; /* memfd: the daemons' journal of backing ids (fs_pt.c) */
	int cfg_fd; /* memfd: the config text the serving daemon served */
	int exe_fd; /* O_PATH: the binary the serving daemon runs, or -1 */
	bool crash; /* the start under way follows a death, not a reload */
	int sig_fd;
	int cwd_fd; /* where relative SOURCE arguments resolve */
	char *exe; /* the binary on disk, read again at each start */
	char **argv; /* ours, with the mount point replaced by /dev/fd/N */
	const char *mountpoint;
	pid_t cur; /* the serving daemon */
	pid_t next; /* a daemon starting, not ready yet */
	pid_t retiring; /* a replaced daemon finishing its requests */
	int ready_fd; /* pipe from next: one byte once it serves */
	unsigned failures;
	struct timespec ready_at, restart_at;
	bool restart_due, failed, stopping, first;
	bool had_failure; /* a daemon crashed: our exit status says so */
	bool reload_due; /* a reload came while sv->next was starting */
	double dying_since; /* sv->cur's main thread seen gone, or 0 */
	double retired_at; /* when sv->retiring was told to leave */
	bool retiring_resent; /* sv_check_retiring() resent for it */
	char pidfile[PATH_MAX + 32]; /* ours, "" when none was written */
};

static void sv_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

static void sv_log(const char *fmt, ...)
{
	char msg[512];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	castfs_fs_log(NULL, msg);
}

static double now_s(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static double ts_s(const struct timespec *t)
{
	return (double)t->tv_sec + (double)t->tv_nsec / 1e9;
}

static void ts_set(struct timespec *t, double s)
{
	t->tv_sec = (time_t)s;
	t->tv_nsec = (long)((s - (double)t->tv_sec) * 1e9);
}

/* ---- the daemon's side ---- */

int castfs_sv_child_env(struct castfs_sv_child *c)
{
	const char *e = getenv("CASTFS_SUPERVISED");

	if (!e)
		return 0;
	/* A supervisor of an older binary (`castfs reload`) sends three,
	 * and no config snapshot. */
	c->pt_fd = -1;
	c->cfg_fd = -1;
	if (sscanf(e, "%d:%d:%d:%d", &c->fuse_fd, &c->init_fd, &c->ready_fd,
		   &c->pt_fd) < 3)
		return -EINVAL;
	e = getenv("CASTFS_CONFIG_SNAPSHOT");
	if (e && sscanf(e, "%d", &c->cfg_fd) != 1)
		return -EINVAL;
	c->crash_restart = getenv("CASTFS_CRASH_RESTART") != NULL;
	c->mountpoint = getenv("CASTFS_MOUNTPOINT");
	c->successor = getenv("CASTFS_SUCCESSOR") != NULL;
	return 1;
}

/*
 * Hand the kernel's FUSE_INIT to the new session as if just read. The
 * first daemon answers it; a later one's answer is refused by the kernel
 * (ENOENT: the request was answered long ago), which libfuse ignores, and
 * the session is initialised with the parameters the kernel negotiated.
 */
int castfs_sv_child_attach(struct fuse_session *se,
			   const struct castfs_sv_child *c,
			   struct castfs_pt *pt)
{
	char path[32];
	struct fuse_buf buf = { 0 };
	ssize_t n;
	int rc = 0;

	snprintf(path, sizeof(path), "/dev/fd/%d", c->fuse_fd);
	if (fuse_session_mount(se, path))
		return -EBADF;
	/* Before INIT: its reply may be amended (fs_pt.c). */
	rc = castfs_fs_io_attach(se, pt);
	if (rc)
		return rc;
	buf.mem = malloc(SV_INIT_MAX);
	if (!buf.mem)
		return -ENOMEM;
	n = pread(c->init_fd, buf.mem, SV_INIT_MAX, 0);
	if (n < (ssize_t)sizeof(struct fuse_in_header)) {
		rc = n < 0 ? -errno : -EIO;
	} else {
		buf.size = (size_t)n;
		castfs_fs_io_saw(buf.mem, buf.size);
		fuse_session_process_buf(se, &buf);
	}
	free(buf.mem);
	close(c->init_fd);
	return rc;
}

int castfs_sv_child_config(const struct castfs_sv_child *c, char **text,
			   size_t *len)
{
	struct stat st;
	ssize_t n;

	if (!c->crash_restart || c->cfg_fd < 0 || fstat(c->cfg_fd, &st) < 0 ||
	    st.st_size == 0)
		return 1;
	*text = malloc((size_t)st.st_size + 1);
	if (!*text)
		return -ENOMEM;
	n = pread(c->cfg_fd, *text, (size_t)st.st_size, 0);
	if (n != st.st_size) {
		free(*text);
		*text = NULL;
		return 1; /* being rewritten: the file then */
	}
	(*text)[n] = '\0';
	*len = (size_t)n;
	return 0;
}

void castfs_sv_child_keep_config(const struct castfs_sv_child *c,
				 const char *text, size_t len)
{
	/* Only the daemon that serves writes: the one starting writes once
	 * it serves, after the old one stopped answering. */
	if (c->cfg_fd < 0)
		return;
	if (ftruncate(c->cfg_fd, 0) < 0 ||
	    (text && pwrite(c->cfg_fd, text, len, 0) != (ssize_t)len))
		sv_log("cannot keep the config for crash restarts: %s",
		       strerror(errno));
}

void castfs_sv_child_ready(const struct castfs_sv_child *c)
{
	/* The supervisor may be gone: then PDEATHSIG ends us anyway. */
	if (write(c->ready_fd, "r", 1) != 1)
		sv_log("cannot tell the supervisor we serve: %s",
		       strerror(errno));
	close(c->ready_fd);
}

/* ---- the supervisor ---- */

/* Requeue what a dead daemon had read but not answered. */
static void sv_resend(struct sv *sv)
{
	struct fuse_out_header oh = {
		.len = sizeof(oh),
		.error = SV_NOTIFY_RESEND,
		.unique = 0,
	};

	if (write(sv->fd, &oh, sizeof(oh)) != (ssize_t)sizeof(oh))
		sv_log("FUSE_NOTIFY_RESEND failed (%s): requests in flight at "
		       "the daemon's death stay unanswered (Linux < 6.9)",
		       strerror(errno));
}

static void sv_child_exec(struct sv *sv, int ready_w)
{
	char env[64];
	sigset_t all;

	/* The daemon must not outlive us: the connection would have no
	 * owner. Then make sure we did not die before the prctl. */
	prctl(PR_SET_PDEATHSIG, SIGKILL);
	if (getppid() == 1)
		_exit(127);
	sigemptyset(&all);
	sigprocmask(SIG_SETMASK, &all, NULL);
	if (fchdir(sv->cwd_fd) < 0)
		_exit(127);
	fcntl(sv->fd, F_SETFD, 0);
	fcntl(sv->init_fd, F_SETFD, 0);
	fcntl(sv->pt_fd, F_SETFD, 0);
	fcntl(sv->cfg_fd, F_SETFD, 0);
	fcntl(ready_w, F_SETFD, 0);
	snprintf(env, sizeof(env), "%d:%d:%d:%d", sv->fd, sv->init_fd, ready_w,
		 sv->pt_fd);
	setenv("CASTFS_SUPERVISED", env, 1);
	setenv("CASTFS_MOUNTPOINT", sv->mountpoint, 1);
	/* The kernel may hold names the daemons before this one answered. */
	if (sv->first)
		unsetenv("CASTFS_SUCCESSOR");
	else
		setenv("CASTFS_SUCCESSOR", "1", 1);
	snprintf(env, sizeof(env), "%d", sv->cfg_fd);
	setenv("CASTFS_CONFIG_SNAPSHOT", env, 1);
	/* After a death, the binary and config of the daemon that died: a
	 * binary moved or a config broken since (a refused reload) took
	 * the mount down at the first crash (bug hunt). A reload reads
	 * both afresh. */
	if (sv->crash) {
		setenv("CASTFS_CRASH_RESTART", "1", 1);
		if (sv->exe_fd >= 0)
			fexecve(sv->exe_fd, sv->argv, environ);
	} else {
		unsetenv("CASTFS_CRASH_RESTART");
	}
	execv(sv->exe, sv->argv);
	fprintf(stderr, "castfs: %s: %s\n", sv->exe, strerror(errno));
	_exit(127);
}

/* Start a daemon as sv->next, after a death if @crash (else the first
 * one, or a reload). Returns 0 or -errno. */
static int sv_spawn(struct sv *sv, bool crash)
{
	int p[2];
	pid_t pid;

	sv->crash = crash;
	if (pipe2(p, O_CLOEXEC) < 0)
		return -errno;
	pid = fork();
	if (pid < 0) {
		close(p[0]);
		close(p[1]);
		return -errno;
	}
	if (pid == 0)
		sv_child_exec(sv, p[1]);
	close(p[1]);
	sv->next = pid;
	sv->ready_fd = p[0];
	sv->restart_due = false;
	return 0;
}

/* Back-off before the next start: 0, then 0.1 s doubling to 1.6 s. */
static void sv_schedule(struct sv *sv)
{
	double delay = sv->failures ? 0.1 * (1u << (sv->failures - 1)) : 0;

	if (sv->failures > SV_MAX_FAILURES) {
		sv_log("the daemon failed %u times in a row: giving up; the "
		       "mount answers EIO until `castfs reload` succeeds",
		       sv->failures);
		sv->failed = true;
		return;
	}
	ts_set(&sv->restart_at, now_s() + delay);
	sv->restart_due = true;
}

/* Hold the binary sv->cur runs (the file itself, even if renamed over or
 * removed since), for the restarts after its death. */
static void sv_keep_exe(struct sv *sv)
{
	char path[64];
	int fd;

	snprintf(path, sizeof(path), "/proc/%d/exe", (int)sv->cur);
	fd = open(path, O_PATH | O_CLOEXEC);
	if (fd < 0)
		return; /* the path on disk, then */
	if (sv->exe_fd >= 0)
		close(sv->exe_fd);
	sv->exe_fd = fd;
}

static void sv_next_ready(struct sv *sv, bool reaped)
{
	char c;
	ssize_t n = read(sv->ready_fd, &c, 1);

	if (n == 0 || (n < 0 && errno != EINTR)) {
		close(sv->ready_fd); /* died before serving: see reap */
		sv->ready_fd = -1;
		return;
	}
	if (n != 1)
		return;
	close(sv->ready_fd);
	sv->ready_fd = -1;
	if (sv->cur) { /* a reload: the old one finishes and leaves */
		/* the clock of the oldest one not resent for: reloads
		 * every second must not keep a stuck one waiting */
		if (!sv->retiring || sv->retiring_resent) {
			sv->retired_at = now_s();
			sv->retiring_resent = false;
		}
		sv->retiring = sv->cur;
		kill(sv->retiring, SIGTERM);
	}
	sv->cur = sv->next;
	sv->next = 0;
	sv->failed = false;
	sv->first = false;
	if (!reaped) /* a reaped pid's /proc entry is gone, or another's */
		sv_keep_exe(sv);
	clock_gettime(CLOCK_MONOTONIC, &sv->ready_at);
}

/* A death that counts towards giving up: a crash or an error exit. An
 * outside SIGKILL (an operator, the OOM killer, a test) says nothing
 * about the daemon: it restarts at once, however often it comes. */
static bool sv_is_failure(int status)
{
	if (WIFSIGNALED(status))
		return WTERMSIG(status) != SIGKILL;
	return WEXITSTATUS(status) != 0;
}

/* Whether wait status @status is a death by a signal that asks for a
 * stop. The daemon catches them (libfuse's handlers) until its loop has
 * ended, then frees its state with the default actions back: a second
 * one then kills it. A stop sends two often enough (Ctrl-C or systemd's
 * SIGTERM to every process of the unit, and ours forwarded): a clean
 * stop must not read as the daemon's crash. */
static bool sv_stop_signal(int status)
{
	return WIFSIGNALED(status) &&
	       (WTERMSIG(status) == SIGTERM || WTERMSIG(status) == SIGINT ||
		WTERMSIG(status) == SIGHUP);
}

/* Whether the kernel still serves the mount: an unmounted (or aborted)
 * connection polls as an error on the supervisor's fd. */
static bool sv_conn_alive(const struct sv *sv)
{
	struct pollfd p = { .fd = sv->fd, .events = POLLIN };

	return poll(&p, 1, 0) >= 0 && !(p.revents & (POLLERR | POLLHUP));
}

/* "signal N" or "exit N": how wait status @status ended, for the log. */
static const char *sv_how_ended(int status, char how[24])
{
	snprintf(how, 24, "%s %d", WIFSIGNALED(status) ? "signal" : "exit",
		 WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status));
	return how;
}

static void sv_reap_cur(struct sv *sv, int status)
{
	char how[24];

	sv->cur = 0;
	if (sv->stopping || (WIFEXITED(status) && WEXITSTATUS(status) == 0 &&
			     !sv_conn_alive(sv))) {
		/* Unmounted, or told to stop: the mount is over. A daemon
		 * that exits 0 under a live mount was stopped by someone
		 * else (a SIGTERM to it alone): replaced like any death.
		 * A crash on its way out (a sanitizer's report at exit) is
		 * still one: nothing restarts, but our exit status says so
		 * (it was lost whenever the stop came first). */
		if (sv_is_failure(status) && !sv_stop_signal(status)) {
			sv->had_failure = true;
			sv_log("the daemon died as the mount ended (%s)",
			       sv_how_ended(status, how));
		}
		sv->stopping = true;
		return;
	}
	sv_resend(sv);
	sv->had_failure |= sv_is_failure(status);
	if (!sv_is_failure(status))
		sv->failures = 0;
	else if (now_s() - ts_s(&sv->ready_at) >= SV_STABLE_S)
		sv->failures = 1;
	else
		sv->failures++;
	sv_log("the daemon died (%s): restarting", sv_how_ended(status, how));
	if (!sv->next)
		sv_schedule(sv);
}

/* Whether the starting daemon's ready byte (or its end) waits unread:
 * reading it cannot block. */
static bool sv_ready_waiting(const struct sv *sv)
{
	struct pollfd p = { .fd = sv->ready_fd, .events = POLLIN };

	return sv->ready_fd >= 0 && poll(&p, 1, 0) == 1;
}

static void sv_reap_next(struct sv *sv, int status)
{
	pid_t pid = sv->next;
	char how[24];

	/* Its SIGCHLD is taken before the ready byte it wrote first when
	 * both wait (a daemon that served and ended with a quick unmount
	 * while we were not scheduled): it served, so it ends as the
	 * serving one. Taken for one that never started, the first
	 * daemon's end failed the mount: exit 1, nothing logged (a CI run
	 * of test_names). Only with none serving: a reload's new daemon
	 * that died keeps the old one serving, as before. */
	if (!sv->cur && sv_ready_waiting(sv)) {
		sv_next_ready(sv, true);
		if (sv->cur == pid) {
			sv_reap_cur(sv, status);
			return;
		}
	}
	sv->next = 0;
	if (sv->ready_fd >= 0)
		close(sv->ready_fd);
	sv->ready_fd = -1;
	if (sv->first || sv->stopping) {
		/* The first daemon could not start: the mount fails. */
		sv->stopping = true;
		return;
	}
	if (sv_is_failure(status))
		sv->failures++;
	sv->had_failure |= sv_is_failure(status);
	sv_log("a new daemon failed to start (%s)%s", sv_how_ended(status, how),
	       sv->cur ? ": the running one keeps serving" : "");
	if (!sv->cur)
		sv_schedule(sv);
}

/* A replaced daemon's end: told to leave, it exits 0 once its requests
 * are answered. A crash then, or a sanitizer's report at its exit, is a
 * failure like the serving daemon's (bug hunt: a retired daemon's leak
 * report never reached the exit status); nothing restarts for it. */
static void sv_reap_retired(struct sv *sv, int status)
{
	char how[24];

	if (!sv_is_failure(status))
		return;
	sv->had_failure = true;
	sv_log("a replaced daemon died (%s)", sv_how_ended(status, how));
}

static void sv_reap(struct sv *sv)
{
	int status;
	pid_t pid;

	while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
		if (pid == sv->cur) {
			sv_reap_cur(sv, status);
		} else if (pid == sv->next) {
			sv_reap_next(sv, status);
		} else {
			/* A retired daemon (maybe of an earlier reload than
			 * sv->retiring), or one sv_check_dying() took for
			 * dead: requeue what it read, not answered. */
			if (pid == sv->retiring)
				sv->retiring = 0;
			sv_resend(sv);
			sv_reap_retired(sv, status);
		}
	}
}

static void sv_stop(struct sv *sv)
{
	sv->stopping = true;
	sv->restart_due = false;
	if (sv->cur)
		kill(sv->cur, SIGTERM);
	if (sv->next)
		kill(sv->next, SIGTERM);
}

static void sv_signal(struct sv *sv)
{
	struct signalfd_siginfo si;

	while (read(sv->sig_fd, &si, sizeof(si)) == (ssize_t)sizeof(si)) {
		if (si.ssi_signo == SIGCHLD) {
			sv_reap(sv);
		} else if (si.ssi_signo == SIGHUP) {
			/* A reload: start one; it replaces the old when ready.
			 * One starting may predate what the reload is for (a
			 * config edited since): another starts after it. */
			if (!sv->stopping)
				sv->reload_due = true;
		} else {
			sv_stop(sv);
		}
	}
}

/* With no daemon that can serve, answer every request with EIO, so that
 * readers fail rather than hang. Returns false once unmounted. */
static bool sv_answer_eio(struct sv *sv)
{
	static char buf[SV_INIT_MAX + 4096];
	const struct fuse_in_header *ih = (const void *)buf;
	struct fuse_out_header oh = { .len = sizeof(oh), .error = -EIO };
	ssize_t n = read(sv->fd, buf, sizeof(buf));

	if (n < 0)
		return errno == EINTR || errno == EAGAIN || errno == ENOENT;
	if (n < (ssize_t)sizeof(*ih))
		return true;
	oh.unique = ih->unique;
	if (ih->opcode != FUSE_FORGET && ih->opcode != FUSE_BATCH_FORGET &&
	    ih->opcode != FUSE_INTERRUPT) {
		if (write(sv->fd, &oh, sizeof(oh)) < 0)
			return true; /* interrupted meanwhile: nothing owed */
	}
	return true;
}

static int sv_timeout_ms(const struct sv *sv)
{
	int t = -1;
	double left;

	if (sv->restart_due) {
		left = ts_s(&sv->restart_at) - now_s();
		t = left <= 0 ? 0 : (int)(left * 1000) + 1;
	}
	if (((sv->cur && !sv->stopping) || sv->retiring) &&
	    (t < 0 || t > SV_WATCH_MS))
		t = SV_WATCH_MS; /* sv_check_dying() */
	return t;
}

/* /proc/@pid/@name into @buf (NUL-terminated); its length, or -1. */
static ssize_t sv_proc_read(pid_t pid, const char *name, char *buf, size_t len)
{
	char path[64];
	ssize_t n;
	int fd;

	snprintf(path, sizeof(path), "/proc/%d/%s", (int)pid, name);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -1;
	n = read(fd, buf, len - 1);
	close(fd);
	if (n < 0)
		return -1;
	buf[n] = '\0';
	return n;
}

/*
 * Whether process @pid is on its way out: its main thread has exited (a
 * zombie waiting for its other threads), or it is dumping core (the dump
 * waits for every thread to stop, the other threads' exits wait for the
 * dump; "CoreDumping" in /proc/PID/status, Linux 4.15).
 */
static bool sv_leader_gone(pid_t pid)
{
	char buf[4096];
	const char *p;

	if (sv_proc_read(pid, "stat", buf, sizeof(buf)) <= 0)
		return false;
	p = strrchr(buf, ')'); /* the name may hold anything */
	if (p && p[1] == ' ' && (p[2] == 'Z' || p[2] == 'X'))
		return true;
	if (sv_proc_read(pid, "status", buf, sizeof(buf)) <= 0)
		return false;
	p = strstr(buf, "\nCoreDumping:");
	return p && strtol(p + sizeof("\nCoreDumping:") - 1, NULL, 10) == 1;
}

/*
 * A killed daemon whose source watcher was inside an invalidation never
 * finishes dying: the kernel's notify waits, uninterruptibly, for the
 * directory lock a lookup holds, and that lookup waits for an answer from
 * the daemon being killed. No exit, so no SIGCHLD and no resend: the mount
 * hung for good. A main thread gone for SV_DYING_S is taken as the death
 * it is: the successor answers the resent lookup, which frees the lock,
 * the notify, and the old daemon's exit (reaped then as a retired one).
 * A crash that dumps core is the same death, slower: the dump waits for
 * that thread too. Nothing is sent to the old daemon: a dump that can
 * finish is written whole.
 */
static void sv_check_dying(struct sv *sv)
{
	if (!sv->cur || sv->stopping || !sv_leader_gone(sv->cur)) {
		sv->dying_since = 0;
		return;
	}
	if (!sv->dying_since)
		sv->dying_since = now_s();
	if (now_s() - sv->dying_since < SV_DYING_S)
		return;
	sv->dying_since = 0;
	sv_log("the daemon is dying with a thread stuck in the kernel: "
	       "restarting without it");
	sv_reap_cur(sv, SIGKILL); /* as the kill's own status: at once */
}

/*
 * A daemon a reload retired that is still there SV_RETIRE_S later: its
 * requests are resent to the serving daemon, once. Told to finish and
 * leave, a daemon whose watcher is inside an invalidation behind a
 * listing's directory lock never answers the READDIR it read, never exits,
 * and so was never reaped and resent: the directory hung for good, and
 * every later daemon's watcher with it (a bug hunt: 800 files changing,
 * listed, reloaded every second, hung in 20 s). A retiring daemon that is
 * only slow answers a request the serving one answers too: the first reply
 * wins, the kernel drops the other.
 */
static void sv_check_retiring(struct sv *sv)
{
	if (!sv->retiring || sv->retiring_resent ||
	    now_s() - sv->retired_at < SV_RETIRE_S)
		return;
	sv->retiring_resent = true;
	sv_log("a retired daemon is still running after %.0f s: its requests "
	       "go to the serving one",
	       SV_RETIRE_S);
	sv_resend(sv);
}

/* One round of the event loop. */
static void sv_poll(struct sv *sv)
{
	struct pollfd p[3] = {
		{ .fd = sv->sig_fd, .events = POLLIN },
		{ .fd = sv->ready_fd, .events = POLLIN },
		{ .fd = sv->failed && !sv->cur && !sv->next ? sv->fd : -1,
		  .events = POLLIN }
	};

	if (poll(p, 3, sv_timeout_ms(sv)) < 0)
		return;
	if (p[0].revents)
		sv_signal(sv);
	if (sv->ready_fd >= 0 && p[1].revents)
		sv_next_ready(sv, false);
	if (p[2].fd >= 0 && (p[2].revents & (POLLERR | POLLHUP)))
		sv_stop(sv); /* unmounted */
	else if (p[2].fd >= 0 && (p[2].revents & POLLIN) && !sv_answer_eio(sv))
		sv_stop(sv);
	if (sv->reload_due && !sv->next && !sv->stopping) {
		sv->reload_due = false;
		sv->failures = 0;
		if (sv_spawn(sv, false))
			sv_log("reload: cannot start a daemon");
	}
	sv_check_dying(sv);
	sv_check_retiring(sv);
	if (sv->restart_due && !sv->stopping && sv_timeout_ms(sv) == 0 &&
	    sv_spawn(sv, true))
		sv_schedule(sv);
}

/* Read the kernel's FUSE_INIT into a memfd every daemon can read. */
static int sv_keep_init(struct sv *sv)
{
	char *buf = malloc(SV_INIT_MAX + 4096);
	ssize_t n;
	int rc = 0;

	if (!buf)
		return -ENOMEM;
	do
		n = read(sv->fd, buf, SV_INIT_MAX + 4096);
	while (n < 0 && errno == EINTR);
	sv->init_fd = memfd_create("castfs-init", MFD_CLOEXEC);
	if (n < (ssize_t)sizeof(struct fuse_in_header) || sv->init_fd < 0 ||
	    write(sv->init_fd, buf, (size_t)n) != n)
		rc = n < 0 ? -errno : -EIO;
	free(buf);
	return rc;
}

static int sv_signals(struct sv *sv)
{
	sigset_t set;

	sigemptyset(&set);
	sigaddset(&set, SIGCHLD);
	sigaddset(&set, SIGHUP);
	sigaddset(&set, SIGTERM);
	sigaddset(&set, SIGINT);
	if (sigprocmask(SIG_BLOCK, &set, NULL) < 0)
		return -errno;
	sv->sig_fd = signalfd(-1, &set, SFD_NONBLOCK | SFD_CLOEXEC);
	return sv->sig_fd < 0 ? -errno : 0;
}

/* Our argv with the mount point replaced by the connection's fd. */
static char **sv_child_argv(int argc, char **argv, const char *mnt_arg, int fd)
{
	char **a = calloc((size_t)argc + 1, sizeof(*a));
	static char fdpath[32];

	if (!a)
		return NULL;
	snprintf(fdpath, sizeof(fdpath), "/dev/fd/%d", fd);
	for (int i = 0; i < argc; i++)
		a[i] = argv[i] == mnt_arg ? fdpath : argv[i];
	return a;
}

/* ---- where `castfs reload` finds the supervisor ---- */

/* The pid file of the mount at @mountpoint: named by the mount's device
 * number, so no request reaches the mount to find it. */
static int sv_pidfile_path(const char *mountpoint, char *buf, size_t len)
{
	const char *xdg = getenv("XDG_RUNTIME_DIR");
	char dir[PATH_MAX], *dev = castfs_mount_device(mountpoint);

	if (!dev)
		return -ENOENT;
	if (geteuid() == 0)
		snprintf(dir, sizeof(dir), "/run/castfs");
	else if (xdg)
		snprintf(dir, sizeof(dir), "%s/castfs", xdg);
	else
		snprintf(dir, sizeof(dir), "/tmp/castfs-%u",
			 (unsigned)getuid());
	if (mkdir(dir, 0700) < 0 && errno != EEXIST) {
		free(dev);
		return -errno;
	}
	snprintf(buf, len, "%s/%s.pid", dir, dev);
	free(dev);
	return 0;
}

/* The lock of the pid files' directory, held by whoever writes or removes
 * one: a supervisor leaving reads its own pid in its file before it
 * unlinks it, and a mount made at the same place since may have got the
 * device number back and written its supervisor's pid there in between.
 * Returns the locked directory's fd or -1 (then unlocked: best effort). */
static int sv_pidfile_lock(const char *path)
{
	char dir[PATH_MAX + 32];
	const char *slash = strrchr(path, '/');
	int fd;

	if (!slash)
		return -1;
	snprintf(dir, sizeof(dir), "%.*s", (int)(slash - path), path);
	fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd >= 0 && flock(fd, LOCK_EX) < 0) {
		close(fd);
		fd = -1;
	}
	return fd;
}

/* Write our pid for the mount at @mountpoint, by a rename so that `castfs
 * reload` never reads half a file; its path goes to @path ("" when none
 * was written: reload by signal still works). */
static void sv_pidfile_write(const char *mountpoint, char *path, size_t len)
{
	char tmp[PATH_MAX + 64];
	int lock, fd;

	path[0] = '\0';
	if (sv_pidfile_path(mountpoint, path, len))
		return;
	snprintf(tmp, sizeof(tmp), "%s.XXXXXX", path);
	lock = sv_pidfile_lock(path);
	fd = mkostemp(tmp, O_CLOEXEC);
	if (fd >= 0) {
		bool ok = dprintf(fd, "%ld\n", (long)getpid()) > 0;

		if (close(fd) < 0 || !ok || rename(tmp, path) < 0) {
			unlink(tmp);
			path[0] = '\0';
		}
	} else {
		path[0] = '\0';
	}
	if (lock >= 0)
		close(lock);
}

/* Remove the pid file at @path we wrote, unless it now holds another pid
 * (see sv_pidfile_lock): by the path it was written at, since the mount
 * is gone by now, or another is at its place. */
static void sv_pidfile_remove(const char *path)
{
	long pid = 0;
	int lock;
	FILE *f;

	if (!path[0])
		return;
	lock = sv_pidfile_lock(path);
	f = fopen(path, "re");
	if (f && fscanf(f, "%ld", &pid) == 1 && pid == (long)getpid())
		unlink(path);
	if (f)
		fclose(f);
	if (lock >= 0)
		close(lock);
}

/* ---- the supervisor's life ---- */

/* fuse_daemonize(), but the caller we leave returns only once our pid
 * file is written: `castfs SRC MNT && castfs reload MNT` finds us. */
static int sv_daemonize(struct sv *sv, const struct castfs_sv_opts *o)
{
	int waiter[2], nullfd;
	char done = 1;
	ssize_t n;

	if (o->foreground) {
		sv_pidfile_write(o->mountpoint, sv->pidfile,
				 sizeof(sv->pidfile));
		return chdir("/") < 0 ? -errno : 0;
	}
	if (pipe2(waiter, O_CLOEXEC) < 0)
		return -errno;
	switch (fork()) {
	case -1:
		close(waiter[0]);
		close(waiter[1]);
		return -errno;
	case 0:
		break;
	default: /* 0 once the child is on its own, 1 if it failed first */
		close(waiter[1]);
		_exit(read(waiter[0], &done, 1) == 1 ? 0 : 1);
	}
	close(waiter[0]);
	if (setsid() < 0 || chdir("/") < 0) {
		close(waiter[1]);
		return -errno;
	}
	nullfd = open("/dev/null", O_RDWR); /* not CLOEXEC: it may be 0 */
	if (nullfd >= 0) {
		dup2(nullfd, 0);
		dup2(nullfd, 1);
		dup2(nullfd, 2);
		if (nullfd > 2)
			close(nullfd);
	}
	sv_pidfile_write(o->mountpoint, sv->pidfile, sizeof(sv->pidfile));
	/* If the caller is gone (killed), there is no one to tell. */
	n = write(waiter[1], &done, 1);
	(void)n;
	close(waiter[1]);
	return 0;
}

static int sv_setup(struct sv *sv, const struct castfs_sv_opts *o)
{
	int rc;

	sv->fd = fuse_session_fd(sv->se);
	sv->cwd_fd = open(".", O_PATH | O_CLOEXEC);
	sv->exe = realpath("/proc/self/exe", NULL);
	sv->argv = sv_child_argv(o->argc, o->argv, o->mnt_arg, sv->fd);
	if (sv->cwd_fd < 0 || !sv->exe || !sv->argv)
		return -ENOMEM;
	rc = sv_keep_init(sv);
	if (rc)
		return rc;
	/* Appended by every daemon (O_APPEND: whole records), read by
	 * the next; backing ids live as long as the connection. */
	sv->pt_fd = memfd_create("castfs-backing", MFD_CLOEXEC);
	if (sv->pt_fd < 0 || fcntl(sv->pt_fd, F_SETFL, O_APPEND) < 0)
		return -errno;
	sv->cfg_fd = memfd_create("castfs-config", MFD_CLOEXEC);
	if (sv->cfg_fd < 0)
		return -errno;
	return sv_signals(sv);
}

int castfs_supervise(struct fuse_session *se, const struct castfs_sv_opts *o)
{
	struct sv sv = { .se = se,
			 .fd = -1,
			 .init_fd = -1,
			 .pt_fd = -1,
			 .cfg_fd = -1,
			 .exe_fd = -1,
			 .sig_fd = -1,
			 .cwd_fd = -1,
			 .ready_fd = -1,
			 .first = true,
			 .mountpoint = o->mountpoint };
	int rc = sv_setup(&sv, o);

	if (!rc)
		rc = sv_daemonize(&sv, o);
	if (!rc)
		rc = sv_spawn(&sv, false);
	while (!rc && (!sv.stopping || sv.cur || sv.next || sv.retiring))
		sv_poll(&sv);
	sv_pidfile_remove(sv.pidfile);
	/* The first daemon never served, or one crashed (a sanitizer report
	 * too): a restart hid it from the readers, not from our caller. */
	if (!rc && (sv.first || sv.had_failure))
		rc = -EIO;
	free(sv.exe);
	free(sv.argv);
	if (sv.cwd_fd >= 0)
		close(sv.cwd_fd);
	if (sv.init_fd >= 0)
		close(sv.init_fd);
	if (sv.pt_fd >= 0)
		close(sv.pt_fd);
	if (sv.cfg_fd >= 0)
		close(sv.cfg_fd);
	if (sv.exe_fd >= 0)
		close(sv.exe_fd);
	if (sv.sig_fd >= 0)
		close(sv.sig_fd);
	return rc;
}

/* ---- castfs reload ---- */

/* @path without following it: a failed mount cannot be stat'ed. */
static char *mount_path(const char *path)
{
	char *a = strdup(path), *b = strdup(path), *dir, *out = NULL;

	if (a && b && (dir = realpath(dirname(a), NULL))) {
		const char *base = basename(b);

		if (asprintf(&out, "%s/%s", strcmp(dir, "/") ? dir : "", base) <
		    0)
			out = NULL;
		free(dir);
	}
	free(a);
	free(b);
	return out;
}

/* True when @pid is a castfs process (not a pid reused since). */
static bool is_castfs(long pid)
{
	char path[64], comm[32] = "";
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%ld/comm", pid);
	f = fopen(path, "r");
	if (!f)
		return false;
	if (!fgets(comm, sizeof(comm), f))
		comm[0] = '\0';
	fclose(f);
	return strncmp(comm, "castfs", 6) == 0;
}

int castfs_sv_reload(const char *mountpoint)
{
	char path[PATH_MAX + 32], *mnt = mount_path(mountpoint);
	long pid = 0;
	FILE *f;
	int rc;

	if (!mnt)
		return -errno ? -errno : -ENOMEM;
	rc = sv_pidfile_path(mnt, path, sizeof(path));
	/* No castfs mount there: a path that exists is not one (a stat is
	 * safe now, no castfs mount can hang it). */
	if (rc == -ENOENT && access(mnt, F_OK) == 0)
		rc = -ESRCH;
	free(mnt);
	if (rc)
		return rc;
	f = fopen(path, "r");
	if (!f)
		return -ESRCH; /* not supervised (-o nosupervise) */
	if (fscanf(f, "%ld", &pid) != 1)
		pid = 0;
	fclose(f);
	if (pid <= 0 || !is_castfs(pid))
		return -ESRCH;
	return kill((pid_t)pid, SIGHUP) < 0 ? -errno : 0;
}
