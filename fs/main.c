/* SPDX-License-Identifier: MIT */
/*
 * castfs: mount a directory of checkpoints with converted views
 * (`castfs [options] SOURCE MOUNTPOINT`), or run a sub-command
 * (`castfs info`, `convert`, `pack`, `unpack`, `reload`).
 */
#include <errno.h>
#include <limits.h>
#include <malloc.h>
#include <math.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "fs.h"

struct options {
	char *source;
	char *views;
	char *config;
	double timeout;
	unsigned read_ahead_kb;
	unsigned threads;
	unsigned zcache_mb;
	unsigned cache_mb;
	int help;
	int version;
	int nosupervise;
	int noxattr;
	int passthrough;
	const char *mnt_arg; /* the argv element naming the mount point */
};

enum {
	KEY_HELP,
	KEY_VERSION,
	KEY_TIMEOUT,
	KEY_READ_AHEAD,
	KEY_THREADS,
	KEY_ZCACHE,
	KEY_CACHE
};

#define OPT(t, p)                                 \
	{                                         \
		t, offsetof(struct options, p), 1 \
	}
static const struct fuse_opt option_spec[] = {
	OPT("views=%s", views),
	OPT("config=%s", config),
	/* Numbers are parsed in opt_proc(): libfuse's sscanf took "-1" as
	 * 4294967295 and "5x" as 5. */
	FUSE_OPT_KEY("timeout=", KEY_TIMEOUT),
	FUSE_OPT_KEY("read_ahead_kb=", KEY_READ_AHEAD),
	FUSE_OPT_KEY("threads=", KEY_THREADS),
	FUSE_OPT_KEY("zcache_mb=", KEY_ZCACHE),
	FUSE_OPT_KEY("cache_mb=", KEY_CACHE),
	OPT("nosupervise", nosupervise),
	OPT("noxattr", noxattr),
	OPT("passthrough", passthrough),
	FUSE_OPT_KEY("-h", KEY_HELP),
	FUSE_OPT_KEY("--help", KEY_HELP),
	FUSE_OPT_KEY("-V", KEY_VERSION),
	FUSE_OPT_KEY("--version", KEY_VERSION),
	FUSE_OPT_END,
};

/* The whole number after "name=" in @arg into *@v, if from @lo to @hi;
 * else -1, said why. */
static int opt_uint(const char *arg, unsigned lo, unsigned hi, unsigned *v)
{
	const char *s = strchr(arg, '=') + 1;
	char *end;
	unsigned long n;

	errno = 0;
	n = strtoul(s, &end, 10);
	if (*s < '0' || *s > '9' || *end || errno || n < lo || n > hi) {
		fprintf(stderr,
			"castfs: -o %s: not a whole number from %u to %u\n",
			arg, lo, hi);
		return -1;
	}
	*v = (unsigned)n;
	return 0;
}

/* "timeout=S": seconds, finite and not negative. */
static int opt_seconds(const char *arg, double *v)
{
	const char *s = strchr(arg, '=') + 1;
	char *end;
	double t;

	errno = 0;
	t = strtod(s, &end);
	if (end == s || *end || errno || !isfinite(t) || t < 0) {
		fprintf(stderr, "castfs: -o %s: not a number of seconds\n",
			arg);
		return -1;
	}
	*v = t;
	return 0;
}

static int opt_proc(void *data, const char *arg, int key,
		    struct fuse_args *outargs)
{
	struct options *o = data;

	(void)outargs;
	switch (key) {
	case KEY_TIMEOUT:
		return opt_seconds(arg, &o->timeout);
	case KEY_READ_AHEAD: /* 0 turns read-ahead off; at most 1 GiB */
		return opt_uint(arg, 0, 1u << 20, &o->read_ahead_kb);
	case KEY_THREADS:
		return opt_uint(arg, 1, 1024, &o->threads);
	case KEY_ZCACHE: /* MiB, at most 1 TiB */
		return opt_uint(arg, 1, 1u << 20, &o->zcache_mb);
	case KEY_CACHE:
		return opt_uint(arg, 1, 1u << 20, &o->cache_mb);
	case KEY_HELP:
		o->help = 1;
		return 0;
	case KEY_VERSION:
		o->version = 1;
		return 0;
	case FUSE_OPT_KEY_NONOPT:
		if (o->source) {
			o->mnt_arg = arg; /* a daemon gets /dev/fd/N there */
			return 1; /* the mountpoint: fuse_parse_cmdline's */
		}
		o->source = realpath(arg, NULL);
		if (!o->source) {
			fprintf(stderr, "castfs: %s: %s\n", arg,
				strerror(errno));
			return -1;
		}
		return 0;
	default:
		return 1;
	}
}

/* Whether path @in is @dir or lies below it (both resolved). */
static bool path_within(const char *in, const char *dir)
{
	size_t n = strlen(dir);

	if (n == 1) /* "/" */
		return true;
	return !strncmp(in, dir, n) && (in[n] == '\0' || in[n] == '/');
}

/*
 * A mount point at or below the source, or above it, is refused: the
 * daemon walks and looks up the source by path, and reaching its own
 * mount there it would wait for itself (the first walk runs before it
 * answers any request), a mount that hangs every reader and cannot be
 * unmounted.
 */
static int mount_overlaps_source(const char *source, const char *mountpoint)
{
	char *m = realpath(mountpoint, NULL);
	bool in = m && path_within(m, source),
	     over = m && path_within(source, m);

	if (in || over)
		fprintf(stderr,
			"castfs: the mount point %s %s the source %s: castfs "
			"would read its own mount\n",
			m, in ? "lies in" : "holds", source);
	free(m);
	/* A missing mount point: fuse_session_mount() says so. */
	return in || over ? -1 : 0;
}

static void usage(const char *prog)
{
	printf("usage: %s [options] SOURCE MOUNTPOINT\n"
	       "       %s info [--view VIEW] [--tensor NAME] FILE...\n"
	       "       %s convert FILE --view VIEW -o OUT\n"
	       "       %s pack [options] FILE.safetensors|DIR...\n"
	       "       %s unpack FILE.safetensors.zst|.zstg...\n"
	       "       %s reload MOUNTPOINT\n\n"
	       "Mount SOURCE read-only at MOUNTPOINT; every X.safetensors gains\n"
	       "converted views X.<view>.safetensors computed on demand, and a\n"
	       "tensor tree X.safetensors.tensors/; /.castfs/ holds stats,\n"
	       "metrics, config, rejected, refused and version.\n"
	       "`castfs info --help`, `castfs convert --help`, `castfs pack --help`\n"
	       "and `castfs unpack --help` describe the sub-commands; the manual:\n"
	       "man castfs (castfs(1), castfs-info(1), castfs-convert(1)).\n\n"
	       "castfs options:\n"
	       "    -o views=LIST          views listed by ls, separated by ':'\n"
	       "                           (a ',' would end the -o option; every\n"
	       "                           view resolves on lookup anyway)\n"
	       "    -o config=FILE         JSON file defining more views and rules\n"
	       "    -o timeout=SECONDS     entry and attribute timeout (86400)\n"
	       "    -o read_ahead_kb=N     kernel read-ahead of the mount (4096)\n"
	       "    -o threads=N           worker threads (default 2 x CPUs, >= 4;\n"
	       "                           FUSE's max_threads and max_idle_threads\n"
	       "                           below are not used)\n"
	       "    -o zcache_mb=N         decoded frames of packed sources\n"
	       "                           (*.safetensors.zst, .zstg) kept in\n"
	       "                           memory, in MiB (16)\n"
	       "    -o cache_mb=N          parsed headers, plans and tensor trees\n"
	       "                           kept for unused checkpoints (64)\n"
	       "    -o nosupervise         one process: no restart after a crash,\n"
	       "                           no `castfs reload`\n"
	       "    -o noxattr             no extended attributes (user.castfs.*):\n"
	       "                           the kernel stops asking, which halves\n"
	       "                           the requests of `ls -l`\n"
	       "    -o passthrough         unconverted files read by the kernel\n"
	       "                           from the source, not through castfs\n"
	       "                           (Linux >= 6.9, root; see README)\n"
	       "    -h, --help             this help\n"
	       "    -V, --version          the version\n\n",
	       prog, prog, prog, prog, prog, prog);
}

static void list_views(const struct castfs_views *vs)
{
	printf("views (* = listed by default):\n");
	for (size_t i = 0; i < vs->n; i++)
		printf("    %c %-14s %s\n", vs->v[i].listed ? '*' : ' ',
		       vs->v[i].name, vs->v[i].summary ? vs->v[i].summary : "");
	printf("\nFUSE options:\n");
}

/* Built-in views, then the config file, then -o views=. */
static int setup_views(struct castfs_fs *fs, const struct options *o,
		       const struct castfs_sv_child *child)
{
	struct castfs_diag d = { { 0 } };
	int rc = 1;

	/* A crash restart serves what the daemon that died served. */
	if (o->config && child)
		rc = castfs_sv_child_config(child, &fs->config_text,
					    &fs->config_len);
	fs->config_kept = rc == 0;
	if (rc > 0 && o->config)
		rc = castfs_fs_config_read(o->config, &fs->config_text,
					   &fs->config_len, &d);
	if (rc > 0)
		rc = 0;
	if (!rc)
		rc = castfs_fs_views_parse(&fs->views, fs->config_text,
					   fs->config_len, &d);

	if (rc) {
		fprintf(stderr, "castfs: %s%s%s\n", o->config ? o->config : "",
			o->config ? ": " : "",
			d.msg[0] ? d.msg : strerror(-rc));
		return -1;
	}
	/* Not the config's fault: named as the option. */
	rc = o->views ? castfs_views_select(&fs->views, o->views, &d) : 0;
	if (rc) {
		fprintf(stderr, "castfs: -o %s\n",
			d.msg[0] ? d.msg : strerror(-rc));
		return -1;
	}
	return 0;
}

static unsigned default_threads(void)
{
	long n = sysconf(_SC_NPROCESSORS_ONLN);

	/* Readers block on the source too: more threads than cores. */
	return n > 2 ? (unsigned)n * 2 : 4;
}

/*
 * Give freed memory back at once: glibc raises its trim and mmap
 * thresholds as large blocks come and go (up to 32 and 64 MiB), and a
 * worker thread's arena never shrinks below its top chunk, so the
 * memory of evicted checkpoints would stay with the daemon. Fixed
 * thresholds keep big buffers (headers, plans) in their own mappings,
 * unmapped when freed, and let arenas shrink (docs/RELIABILITY.md).
 *
 * No fastbins either: a parsed header is mostly small blocks (names,
 * shapes), which free() parks in fastbins without merging them. The
 * malloc_trim() after an eviction merges them into a worker arena's top
 * chunk and then shrinks only the main arena's, so the whole header's
 * pages stayed resident (5 MB per arena, in 5 of 8 runs of
 * test_cache_budget). Freed small blocks now merge as they are freed,
 * and a merge into the top trims it; a listing that parses three
 * 100,000-tensor headers took the same time either way.
 */
static void malloc_give_back(void)
{
	mallopt(M_MMAP_THRESHOLD, 1 << 20);
	mallopt(M_TRIM_THRESHOLD, 1 << 20);
	mallopt(M_MXFAST, 0);
}

static int setup_ns(struct castfs_fs *fs, const struct options *o,
		    const char *mountpoint, bool successor)
{
	struct castfs_config_info info = {
		.source = o->source,
		.mountpoint = mountpoint,
		.config_file = o->config,
		.views = &fs->views,
		.threads = o->threads,
		.timeout = fs->timeout,
		.read_ahead_kb = o->read_ahead_kb,
	};
	struct castfs_ns_opts nso = {
		.source = o->source,
		.views = &fs->views,
		.log = castfs_fs_log,
		.log_ctx = fs,
		.guard = castfs_fs_lease_init(),
		.zcache_bytes = (size_t)o->zcache_mb << 20,
		.cache_bytes = (size_t)o->cache_mb << 20,
		.successor = successor,
		.listing_changed = castfs_fs_listing_changed,
		.listing_ctx = fs,
	};
	struct castfs_diag d = { { 0 } };
	char *config_json;
	int rc;

	malloc_give_back();
	rc = castfs_stats_new(fs->views.n, &fs->stats);
	if (rc)
		return rc;
	nso.stats = fs->stats;
	config_json = castfs_config_render(&info);
	nso.config_json = config_json;
	rc = castfs_ns_new(&nso, &fs->ns, &d);
	free(config_json);
	if (rc)
		fprintf(stderr, "castfs: %s\n",
			d.msg[0] ? d.msg : strerror(-rc));
	return rc;
}

static int run_loop(struct castfs_fs *fs, struct fuse_cmdline_opts *cmd,
		    const struct options *o)
{
	struct fuse_loop_config *cfg;
	int rc;

	if (cmd->singlethread)
		return fuse_session_loop(fs->se);
	cfg = fuse_loop_cfg_create();
	if (!cfg)
		return -1;
	fuse_loop_cfg_set_clone_fd(cfg, (unsigned)cmd->clone_fd);
	fuse_loop_cfg_set_max_threads(cfg, o->threads);
	fuse_loop_cfg_set_idle_threads(cfg, o->threads);
	rc = fuse_session_loop_mt(fs->se, cfg);
	fuse_loop_cfg_destroy(cfg);
	return rc;
}

/* Mount options every castfs mount has: read-only, permissions enforced. */
static int add_mount_args(struct fuse_args *args, const char *source)
{
	char fsname[PATH_MAX * 2 + 32], *p = fsname;

	p += sprintf(p, "-ofsname=castfs:");
	for (const char *s = source; *s; s++) {
		if (*s == ',' || *s == '\\')
			*p++ = '\\';
		*p++ = *s;
	}
	*p = '\0';
	if (fuse_opt_add_arg(args, "-oro") ||
	    fuse_opt_add_arg(args, "-odefault_permissions") ||
	    fuse_opt_add_arg(args, "-osubtype=castfs") ||
	    fuse_opt_add_arg(args, fsname))
		return -1;
	return 0;
}

/*
 * Connect session fs->se to the kernel: mount (and daemonize), or, for a
 * daemon under the supervisor, continue on the connection it holds.
 */
static int attach(struct castfs_fs *fs, struct fuse_cmdline_opts *cmd,
		  const struct options *o, const struct castfs_sv_child *child)
{
	int rc;

	castfs_fs_log_init(cmd->foreground);
	if (child) {
		/* Requests in flight on a cloned fd die with it; on the
		 * supervisor's fd they are resent to the next daemon. */
		cmd->clone_fd = 0;
		return castfs_sv_child_attach(fs->se, child, fs->pt);
	}
	if (fuse_session_mount(fs->se, cmd->mountpoint))
		return -EIO;
	rc = castfs_fs_io_attach(fs->se, fs->pt);
	if (rc)
		return rc;
	castfs_fs_set_read_ahead(cmd->mountpoint, o->read_ahead_kb);
	fuse_daemonize(cmd->foreground);
	return 0;
}

static int mount_and_serve(struct castfs_fs *fs, struct fuse_args *args,
			   struct fuse_cmdline_opts *cmd,
			   const struct options *o,
			   const struct castfs_sv_child *child)
{
	struct castfs_watch *watch = NULL;
	int rc = 1;

	fs->se = fuse_session_new(args, &castfs_fs_ops, sizeof(castfs_fs_ops),
				  fs);
	if (!fs->se)
		return 1;
	if (fuse_set_signal_handlers(fs->se))
		goto out_destroy;
	/* libfuse ends the loop on SIGHUP; without a supervisor that is an
	 * unmount, and SIGHUP is what asks for a reload (castfs@.service's
	 * ExecReload): a reload needs the supervisor, so it is ignored (bug
	 * hunt: `systemctl reload` unmounted a -o nosupervise mount). */
	if (!child)
		signal(SIGHUP, SIG_IGN);
	if (attach(fs, cmd, o, child))
		goto out_signals;
	if (fs->config_kept)
		castfs_fs_log(fs, "restarted after a crash: serving the config "
				  "the daemon before served, not the file's");
	/* After daemonizing: the watcher is a thread. Without it changes
	 * still show once the entry and attribute timeouts expire. */
	if (castfs_watch_start(fs, o->source, &watch))
		castfs_fs_log(fs, "cannot watch the source for changes");
	if (child) {
		castfs_sv_child_keep_config(child, fs->config_text,
					    fs->config_len);
		castfs_sv_child_ready(child);
	}
	rc = run_loop(fs, cmd, o);
	/* Stopped by SIGTERM or SIGINT (> 0): a clean stop that unmounts,
	 * exit 0 as documented (`systemctl stop` of a -o nosupervise unit
	 * exited 1, a bug hunt); under the supervisor it ends the mount,
	 * never a crash to restart (Ctrl-C reaches both processes). */
	rc = rc < 0 ? 1 : 0;
	if (castfs_watch_stop(watch)) {
		/* The watcher still uses the session and the namespace:
		 * unmount (which frees it) and leave without freeing them. */
		fuse_session_unmount(fs->se);
		_exit(rc);
	}
	fuse_session_unmount(fs->se);
out_signals:
	fuse_remove_signal_handlers(fs->se);
out_destroy:
	fuse_session_destroy(fs->se);
	return rc;
}

/*
 * Mount, and keep the connection in this process while daemons serve it
 * (fs_super.c): a crash or an upgrade of the daemon never ends the mount.
 */
static int mount_supervised(struct fuse_args *args,
			    struct fuse_cmdline_opts *cmd,
			    const struct options *o, int argc, char **argv)
{
	struct castfs_sv_opts so = {
		.argc = argc,
		.argv = argv,
		.mnt_arg = o->mnt_arg,
		.mountpoint = cmd->mountpoint,
		.foreground = cmd->foreground,
	};
	struct fuse_session *se;
	int rc = 1;

	sigset_t stop;

	/* Held from before the mount exists until the supervisor reads them
	 * from its signalfd: a SIGHUP (systemctl reload) right after the
	 * mount appeared killed us by its default action, leaving a dead
	 * mount (bug hunt). */
	sigemptyset(&stop);
	sigaddset(&stop, SIGHUP);
	sigaddset(&stop, SIGTERM);
	sigaddset(&stop, SIGINT);
	sigprocmask(SIG_BLOCK, &stop, NULL);
	se = fuse_session_new(args, &castfs_fs_ops, sizeof(castfs_fs_ops),
			      NULL);
	if (!se)
		return 1;
	castfs_fs_log_init(cmd->foreground);
	if (!fuse_session_mount(se, cmd->mountpoint)) {
		castfs_fs_set_read_ahead(cmd->mountpoint, o->read_ahead_kb);
		rc = castfs_supervise(se, &so) ? 1 : 0;
		fuse_session_unmount(se);
	}
	fuse_session_destroy(se);
	return rc;
}

static int mount_main(int argc, char **argv)
{
	struct castfs_sv_child child_buf, *child = &child_buf;
	struct fuse_args args = FUSE_ARGS_INIT(argc, argv);
	/* A 4 MiB window: one sequential reader then has about four 1 MiB
	 * requests in flight, which keeps both workers of a 2-CPU host busy
	 * for the views whose daemon side costs most (BENCHMARKS.md, stop 51);
	 * 1 MiB left one CPU idle a third of the time. */
	struct options o = { .timeout = 86400, .read_ahead_kb = 4096 };
	struct fuse_cmdline_opts cmd = { 0 };
	struct castfs_fs fs = { 0 };
	int rc = 1;

	if (fuse_opt_parse(&args, &o, option_spec, opt_proc) ||
	    fuse_parse_cmdline(&args, &cmd))
		goto out_args;
	if (o.help || o.version || cmd.show_help || cmd.show_version) {
		const char *what = o.version || cmd.show_version ? "--version" :
								   "--help";

		if (o.version || cmd.show_version) {
			printf("castfs %s (libfuse %s)\n", PACKAGE_VERSION,
			       fuse_pkgversion());
		} else {
			usage(argv[0]);
			/* With -o config=, its views too (castfs(1)). */
			if (!castfs_fs_views_load(&fs.views, o.config, NULL))
				list_views(&fs.views);
			fuse_cmdline_help();
			fuse_lowlevel_help();
		}
		/* Cut by a full disk, the text is an error (exit 1). */
		rc = cli_stdout_close(what) ? 1 : 0;
		goto out_args;
	}
	if (!o.source || !cmd.mountpoint) {
		fprintf(stderr,
			"usage: %s [options] SOURCE MOUNTPOINT "
			"(--help for more)\n",
			argv[0]);
		goto out_args;
	}
	rc = castfs_sv_child_env(child);
	if (rc < 0) {
		fprintf(stderr, "castfs: CASTFS_SUPERVISED is garbled\n");
		rc = 1;
		goto out_args;
	}
	if (rc == 0)
		child = NULL;
	rc = 1;
	/* A supervised daemon gets /dev/fd/N: its supervisor checked. */
	if (!child && mount_overlaps_source(o.source, cmd.mountpoint))
		goto out_args;
	if (!o.threads)
		o.threads = default_threads();
	fs.timeout = o.timeout;
	fs.read_ahead_kb = o.read_ahead_kb;
	fs.noxattr = o.noxattr;
	/* The supervisor sets up the namespace too, only to fail before
	 * mounting on what a daemon would fail on. */
	if (setup_views(&fs, &o, child) ||
	    setup_ns(&fs, &o, child ? child->mountpoint : cmd.mountpoint,
		     child && child->successor) ||
	    castfs_fs_thread_key_init(&fs) || castfs_fs_handles_init(&fs) ||
	    (o.passthrough && castfs_pt_new(fs.stats, &fs.pt)) ||
	    add_mount_args(&args, o.source))
		goto out_free;
	if (fs.pt && child && child->pt_fd >= 0)
		castfs_pt_set_journal(fs.pt, child->pt_fd);
	if (!child && !o.nosupervise)
		rc = mount_supervised(&args, &cmd, &o, argc, argv);
	else
		rc = mount_and_serve(&fs, &args, &cmd, &o, child);
out_free:
	castfs_fs_handles_fini(&fs);
	castfs_ns_free(fs.ns);
	castfs_stats_free(fs.stats);
out_args:
	castfs_pt_free(fs.pt);
	castfs_views_fini(&fs.views);
	free(fs.config_text);
	free(cmd.mountpoint);
	free(o.source);
	free(o.views);
	free(o.config);
	fuse_opt_free_args(&args);
	return rc;
}

/* castfs reload MOUNTPOINT: replace the daemon of a supervised mount with
 * the binary now on disk, started with the mount's command line. */
static int reload_main(int argc, char **argv)
{
	int rc;

	if (argc != 2 || argv[1][0] == '-') {
		fprintf(stderr, "usage: castfs reload MOUNTPOINT\n");
		return argc == 2 && (!strcmp(argv[1], "-h") ||
				     !strcmp(argv[1], "--help")) ?
			       0 :
			       1;
	}
	rc = castfs_sv_reload(argv[1]);
	if (rc == -ESRCH)
		fprintf(stderr,
			"castfs: %s: no castfs supervisor (not a castfs "
			"mount, or mounted with -o nosupervise)\n",
			argv[1]);
	else if (rc)
		fprintf(stderr, "castfs: %s: %s\n", argv[1], strerror(-rc));
	return rc ? 1 : 0;
}

/* A command's exit status, unless a signal it caught ends the process. */
static int cli_exit(int status)
{
	cli_exit_signalled();
	return status;
}

int main(int argc, char **argv)
{
	if (argc > 1 && strcmp(argv[1], "info") == 0)
		return castfs_cli_info(argc - 1, argv + 1);
	if (argc > 1 && strcmp(argv[1], "convert") == 0)
		return cli_exit(castfs_cli_convert(argc - 1, argv + 1));
	if (argc > 1 && strcmp(argv[1], "pack") == 0)
		return cli_exit(castfs_cli_pack(argc - 1, argv + 1));
	if (argc > 1 && strcmp(argv[1], "unpack") == 0)
		return cli_exit(castfs_cli_unpack(argc - 1, argv + 1));
	if (argc > 1 && strcmp(argv[1], "reload") == 0)
		return reload_main(argc - 1, argv + 1);
	return mount_main(argc, argv);
}
