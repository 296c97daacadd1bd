/* SPDX-License-Identifier: MIT */
/*
 * DIR.<q>.gguf beside a transformers causal-LM folder DIR/ (level 5): one
 * llama.cpp GGUF file computed from DIR/model.safetensors, config.json,
 * tokenizer.json, tokenizer_config.json and the chat template files
 * (modeldir/modeldir_gguf.c).
 * The node's identity is the weights'; the text files' identities are its
 * dep fingerprint, checked again at every getattr and open, so a changed
 * config never mixes into a file already looked up (ESTALE instead).
 *
 * The outcome of a build (the plan, or why it does not build) is cached in
 * the weights' checkpoint entry, keyed by view and dep: getattr, open and
 * listings parse the JSON once per identity of the files, not per call.
 * An edited text file changes the dep (a new entry); an edited config.json
 * also drops the checkpoint entry (castfs_ns_invalidate), and changed
 * weights are a new checkpoint entry. Plans, a listing's too, are kept
 * and charged to the cache budget: past it, an entry nothing holds is
 * evicted and one only the kernel's nodes hold gives its outcomes back
 * (built again on need); open files and requests hold the entry, so a
 * plan in use is never freed.
 */
#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/escape.h"
#include "common/hash.h"
#include "modeldir/modeldir.h"
#include "ns/ns_kind_internal.h"
#include "view/qsrc.h"

/* The text files the GGUF is made of; the first two are required. The
 * chat template files are read as gguf-py's SpecialVocab reads them. */
static const char *const texts[] = { "config.json", "tokenizer.json",
				     "tokenizer_config.json",
				     "chat_template.jinja",
				     "chat_template.json" };
#define NTEXTS (sizeof(texts) / sizeof(texts[0]))
#define TEXT_JINJA 3 /* chat_template.jinja */

/* Read beside chat_template.jinja only, as gguf-py's SpecialVocab: its
 * *.jinja files are named chat templates. More than XTMPL_MAX are
 * refused (their texts count in the build's TEXT_BUDGET). */
static const char xtmpl_dir[] = "additional_chat_templates";
#define XTMPL_MAX 64
#define XTMPL_JINJA ".jinja"

/* The files of a folder's additional_chat_templates/. */
struct xtmpls {
	size_t n; /* XTMPL_MAX + 1: too many (names not kept) */
	char **name; /* sorted bytewise */
	struct stat *st; /* st_mode 0: not a regular file */
	char **text; /* read by xtmpls_read(), NULL: not read */
	bool link; /* the folder is a symbolic link (not followed; none) */
	int open_err; /* the folder could not be opened (none read) */
	char why[128]; /* xtmpls_why()'s text for @open_err */
};

/* The index of sharded weights (their GGUF file's node's path). */
static const char index_name[] = "model.safetensors.index.json";
#define INDEX_NAME_LEN (sizeof(index_name) - 1)

/*
 * The most bytes of text files one build reads, all of them together:
 * each GGUF view's header holds them, and a build peaks at four times
 * them. Each file could take 256 MiB, the 64 additional templates too: a
 * folder of 300 MB of templates kept 300 MB per GGUF view built and
 * peaked at 1.2 GB, 17 GB of them would have been read at once (a bug
 * hunt). A real tokenizer.json is at most a few tens of MiB, a template
 * kilobytes.
 */
#define TEXT_BUDGET NS_TEXT_MAX

/* Cached outcomes per checkpoint entry; beyond, plans are per open (a
 * folder whose texts keep changing must not grow the cache forever). */
#define GGUF_ENTS_MAX 64

/*
 * Builds running at once in the mount (ns->gguf_builds). A build holds
 * its texts and their cJSON trees (~80 bytes a JSON value: ~100 MB for
 * Llama 3's tokenizer.json), and `ls -l` of a folder's parent asks for
 * every DIR.<q>.gguf at once: seven builds of a 4 M-value tokenizer
 * peaked at 668 MB (a bug hunt).
 */
#define GGUF_BUILDS_MAX 2

/* A build that read more text than this hands the heap it freed back to
 * the system: glibc keeps it in the worker's arena, so the peak of the
 * builds stayed resident. Small builds skip the trim's walk. */
#define GGUF_TRIM_TEXT (1u << 20)

/* One outcome of (view, dep) in a checkpoint entry's NS_CKPT_GGUF slot.
 * Never removed while the checkpoint entry is held (the budget's trim
 * frees the slot only of an entry nobody holds); @plan is set at most
 * once. All fields under the checkpoint's lock. */
struct gguf_ent {
	struct gguf_ent *next;
	const struct castfs_view *view;
	uint64_t dep;
	bool known; /* @err and @reason hold the builder's outcome */
	/* A request builds it now; the others for it wait on @built, which
	 * is broadcast when that build ends, whatever its outcome. */
	bool building;
	pthread_cond_t built;
	int err; /* 0: builds; else the builder's error */
	struct castfs_plan *plan; /* NULL until first needed (err == 0) */
	char reason[256];
};

/* Registered as the checkpoint cache's fini of NS_CKPT_GGUF. */
static void gguf_ents_fini(struct ns_ckpt *ck)
{
	struct gguf_ent *e;

	while ((e = ck->slot[NS_CKPT_GGUF])) {
		ck->slot[NS_CKPT_GGUF] = e->next;
		castfs_plan_free(e->plan);
		pthread_cond_destroy(&e->built);
		free(e);
	}
}

void ns_mdgguf_init(struct castfs_ns *ns)
{
	ns->ckpt_fini[NS_CKPT_GGUF] = gguf_ents_fini;
}

/* @h with the identity of @st folded in. */
static uint64_t ident_hash(uint64_t h, const struct stat *st)
{
	h = castfs_fnv1a(h, &st->st_ino, sizeof(st->st_ino));
	h = castfs_fnv1a(h, &st->st_size, sizeof(st->st_size));
	h = castfs_fnv1a(h, &st->st_mtim, sizeof(st->st_mtim));
	return castfs_fnv1a(h, &st->st_ctim, sizeof(st->st_ctim));
}

static void xtmpls_fini(struct xtmpls *x)
{
	for (size_t i = 0; x->name && i < x->n; i++)
		free(x->name[i]);
	for (size_t i = 0; x->text && i < x->n; i++)
		free(x->text[i]);
	free(x->name);
	free(x->text);
	free(x->st);
	*x = (struct xtmpls){ 0 };
}

static int name_cmp(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Whether @name matches pathlib's glob "*.jinja" (dot files too). */
static bool is_jinja(const char *name)
{
	size_t n = strlen(name), k = sizeof(XTMPL_JINJA) - 1;

	return n >= k && !strcmp(name + n - k, XTMPL_JINJA);
}

/* The *.jinja names of open directory @dp into @x, unsorted. */
static int xtmpls_names(DIR *dp, struct xtmpls *x)
{
	size_t cap = 0;
	struct dirent *de;

	while ((errno = 0, de = readdir(dp))) {
		if (!is_jinja(de->d_name))
			continue;
		if (x->n == XTMPL_MAX) {
			xtmpls_fini(x);
			x->n = XTMPL_MAX + 1;
			return 0;
		}
		if (x->n == cap) {
			char **nv = realloc(x->name, (cap + 8) * sizeof(*nv));

			if (!nv)
				return -ENOMEM;
			x->name = nv;
			cap += 8;
		}
		if (!(x->name[x->n] = strdup(de->d_name)))
			return -ENOMEM;
		x->n++;
	}
	return errno ? -errno : 0;
}

/* Open @dir (a folder's additional_chat_templates) into *@dp, or leave
 * it NULL: none, or a symbolic link (@x->link: links to folders are not
 * followed, and gguf-py would read through it; the builder refuses). */
static int xtmpls_open(struct castfs_ns *ns, const char *dir, struct xtmpls *x,
		       DIR **dp)
{
	struct stat st;
	int fd, rc = ns_src_stat(ns, dir, &st);

	*dp = NULL;
	if (rc == -ENOENT || rc == -ENOTDIR)
		return 0; /* glob() of a missing folder: nothing */
	if (rc)
		return rc;
	x->link = S_ISLNK(st.st_mode);
	if (!S_ISDIR(st.st_mode))
		return 0; /* a file: glob() finds nothing in it either */
	fd = ns_src_open(ns, dir, O_RDONLY | O_DIRECTORY);
	if (fd == -ENOENT || fd == -ENOMEM || fd == -EMFILE || fd == -ENFILE)
		return fd == -ENOENT ? -ESTALE : fd;
	if (fd < 0) {
		/* EACCES...: a reason for the builder, not a GGUF that
		 * vanishes without one (gguf-py's glob() would skip the
		 * folder silently: a GGUF without its templates) */
		x->open_err = fd;
		return 0;
	}
	*dp = fdopendir(fd);
	if (!*dp) {
		rc = -errno;
		close(fd);
	}
	return rc;
}

/* The files of @folder's additional_chat_templates/ into @x (none without
 * the folder), sorted, each stat'ed as the text files are, and their
 * fingerprint folded into *@h. */
static int xtmpls_scan(struct castfs_ns *ns, const char *folder,
		       struct xtmpls *x, uint64_t *h)
{
	char *dir = ns_path_join(folder, xtmpl_dir, sizeof(xtmpl_dir) - 1);
	DIR *dp = NULL;
	int rc;

	*x = (struct xtmpls){ 0 };
	rc = dir ? xtmpls_open(ns, dir, x, &dp) : -ENOMEM;
	if (dp)
		rc = xtmpls_names(dp, x);
	if (dp)
		closedir(dp);
	if (!rc && x->n <= XTMPL_MAX) {
		if (x->n) /* x->name is NULL without names */
			qsort(x->name, x->n, sizeof(*x->name), name_cmp);
		x->st = calloc(x->n + 1, sizeof(*x->st));
		rc = x->st ? 0 : -ENOMEM;
	}
	for (size_t i = 0; !rc && x->st && i < x->n; i++) {
		char *p = ns_path_join(dir, x->name[i], strlen(x->name[i]));

		rc = p ? ns_src_stat_in(ns, p, &x->st[i]) : -ENOMEM;
		free(p);
		if (rc == -ENOMEM)
			break;
		if (rc || !S_ISREG(x->st[i].st_mode))
			memset(&x->st[i], 0, sizeof(x->st[i]));
		rc = 0;
		*h = castfs_fnv1a(*h, x->name[i], strlen(x->name[i]) + 1);
		*h = ident_hash(*h, &x->st[i]);
	}
	*h = castfs_fnv1a(*h, &x->n, sizeof(x->n));
	*h = castfs_fnv1a(*h, &x->link, sizeof(x->link));
	*h = castfs_fnv1a(*h, &x->open_err, sizeof(x->open_err));
	free(dir);
	if (rc)
		xtmpls_fini(x);
	return rc;
}

/* The identities of the text files of folder @dir into @st (st_mode 0
 * for a missing optional one) and their fingerprint into @dep, so that
 * an edit makes a new node; that of additional_chat_templates/ (0 when
 * not read) into @xdep unless NULL. -ENOENT when a required one is
 * missing. */
static int texts_dep(struct castfs_ns *ns, const char *dir, uint64_t *dep,
		     struct stat st[NTEXTS], uint64_t *xdep)
{
	uint64_t h = CASTFS_FNV_SEED, xh = 0;
	struct xtmpls x;

	for (size_t i = 0; i < NTEXTS; i++) {
		char *p = ns_path_join(dir, texts[i], strlen(texts[i]));
		int rc;

		memset(&st[i], 0, sizeof(st[i]));
		if (!p)
			return -ENOMEM;
		rc = ns_src_stat_in(ns, p, &st[i]);
		free(p);
		if (rc && (i < 2 || rc != -ENOENT))
			return rc;
		if (!rc && !S_ISREG(st[i].st_mode))
			return -ENOENT;
		if (rc)
			memset(&st[i], 0, sizeof(st[i]));
		h = ident_hash(h, &st[i]);
	}
	if (st[TEXT_JINJA].st_mode) {
		int rc;

		xh = CASTFS_FNV_SEED;
		rc = xtmpls_scan(ns, dir, &x, &xh);
		xtmpls_fini(&x);
		if (rc)
			return rc;
		h = castfs_fnv1a(h, &xh, sizeof(xh));
	}
	if (xdep)
		*xdep = xh;
	*dep = castfs_mix64(h) | 1;
	return 0;
}

/* The GGUF plan through @v of the texts @text (@len bytes each), the
 * @nxt additional chat templates @xt (or why they are refused, @xwhy) and
 * the weights: checkpoint @ck, or
 * the shards @sh when it is set. */
static int plan_of(const struct castfs_view *v, char *const text[NTEXTS],
		   const size_t len[NTEXTS], const struct castfs_md_xtmpl *xt,
		   size_t nxt, const char *xwhy,
		   const struct ns_gguf_shards *sh, const struct ns_ckpt *ck,
		   struct castfs_plan **plan, struct castfs_diag *d)
{
	const struct castfs_header *one = ck->h, **hs = NULL;
	struct castfs_qsrc_opts qo;
	struct castfs_md_gguf_src s = {
		.config = text[0],
		.config_len = len[0],
		.tokenizer = text[1],
		.tokenizer_len = len[1],
		.tok_config = text[2],
		.tok_config_len = len[2],
		.chat_jinja = text[3],
		.chat_jinja_len = len[3],
		.chat_json = text[4],
		.chat_json_len = len[4],
		.xtmpl = xt,
		.nxtmpl = nxt,
		.xtmpl_why = xwhy,
		.h = &one,
		.nh = 1,
		/* the FP8 block size config.json gives: the first shard's
		 * entry holds the folder's */
		.qopts = ns_ckpt_qopts(ck, &qo),
	};
	int rc;

	if (sh) {
		hs = calloc(sh->n, sizeof(*hs));
		if (!hs)
			return -ENOMEM;
		for (size_t k = 0; k < sh->n; k++)
			hs[k] = sh->ck[k]->h;
		s.index = sh->index;
		s.index_len = sh->index_len;
		s.shards = (const char *const *)sh->names;
		s.h = hs;
		s.nh = sh->n;
	}
	rc = castfs_md_gguf_plan_src(v, &s, plan, d);
	free(hs);
	return rc;
}

/* Why the builder must refuse @x if it reads the templates, or NULL. */
static const char *xtmpls_why(struct xtmpls *x)
{
	_Static_assert(XTMPL_MAX == 64, "the message says 64");
	if (x->open_err) {
		snprintf(x->why, sizeof(x->why),
			 "GGUF: additional_chat_templates/ cannot be read: %s",
			 strerror(-x->open_err));
		return x->why;
	}
	if (x->link)
		return "GGUF: additional_chat_templates is a symbolic link, "
		       "which castfs does not follow";
	if (x->n > XTMPL_MAX)
		return "GGUF: more than 64 files in additional_chat_templates/";
	return NULL;
}

/*
 * The files of @folder's additional_chat_templates/ (@x), read into a new
 * array *@xt, if their fingerprint is still @xdep (else -ESTALE); a file
 * that is not regular or not readable has no text (the builder refuses
 * it when it would read it). None are read past XTMPL_MAX or through a
 * link (xtmpls_why()).
 */
static int xtmpls_read(struct castfs_ns *ns, const char *folder, uint64_t xdep,
		       struct xtmpls *x, struct castfs_md_xtmpl **xt,
		       size_t *used)
{
	uint64_t h = CASTFS_FNV_SEED;
	int rc = xtmpls_scan(ns, folder, x, &h);
	char *dir = NULL;

	if (!rc && h != xdep)
		rc = -ESTALE;
	if (!rc && (x->n > XTMPL_MAX || x->link || x->open_err))
		return 0;
	if (!rc && x->n &&
	    (!(*xt = calloc(x->n, sizeof(**xt))) ||
	     !(x->text = calloc(x->n, sizeof(*x->text)))))
		rc = -ENOMEM;
	for (size_t i = 0; !rc && i < x->n; i++) {
		char *p, *t = NULL;
		size_t len = 0;
		int r;

		(*xt)[i].name = x->name[i];
		if (!x->st[i].st_mode)
			continue;
		dir = dir ? dir :
			    ns_path_join(folder, xtmpl_dir,
					 sizeof(xtmpl_dir) - 1);
		p = dir ? ns_path_join(dir, x->name[i], strlen(x->name[i])) :
			  NULL;
		r = p ? ns_src_read_text(ns, p, &x->st[i], TEXT_BUDGET - *used,
					 &t, &len) :
			-ENOMEM;
		free(p);
		if (r == -ENOMEM || r == -ESTALE || r == -EFBIG)
			rc = r;
		*used += len;
		x->text[i] = t;
		(*xt)[i].text = r ? NULL : t;
		(*xt)[i].len = len;
	}
	free(dir);
	return rc;
}

/* What one lookup of the cache needs and gives. */
struct gguf_req {
	const char *folder;
	const struct castfs_view *view;
	uint64_t dep;
	struct stat st[NTEXTS];
	uint64_t xdep; /* additional_chat_templates/'s fingerprint */
	bool want_plan; /* false: whether it builds (listings): no uncached plan */
	struct ns_gguf_shards sh; /* sharded weights (sh.n > 0), held */
	const struct castfs_plan *plan; /* out: held by the checkpoint */
	struct castfs_plan *owned; /* out: not cached, the caller's */
	char reason[256]; /* out: why not, when it does not build */
	size_t text_bytes; /* out: the text a build read */
};

/*
 * Build the GGUF plan of r->folder through r->view from checkpoint @ck
 * (or the shards r->sh) and the text files of identities r->st (read
 * again; a file that changed since is -ESTALE, so a plan never mixes two
 * versions). The builder's reason goes to r->reason and the log.
 */
static int build_plan(struct castfs_ns *ns, struct ns_ckpt *ck,
		      struct gguf_req *r, struct castfs_plan **plan)
{
	struct castfs_diag d = { { 0 } };
	char *text[NTEXTS] = { 0 };
	size_t len[NTEXTS] = { 0 };
	struct castfs_md_xtmpl *xt = NULL;
	struct xtmpls x = { 0 };
	size_t used = 0;
	int rc = 0;

	for (size_t i = 0; !rc && i < NTEXTS; i++) {
		char *p;

		if (!r->st[i].st_mode)
			continue; /* tokenizer_config.json ... are optional */
		p = ns_path_join(r->folder, texts[i], strlen(texts[i]));
		rc = p ? ns_src_read_text(ns, p, &r->st[i], TEXT_BUDGET - used,
					  &text[i], &len[i]) :
			 -ENOMEM;
		free(p);
		used += len[i];
	}
	if (!rc && r->st[TEXT_JINJA].st_mode)
		rc = xtmpls_read(ns, r->folder, r->xdep, &x, &xt, &used);
	if (rc == -EFBIG)
		castfs_diag_set(&d, rc,
				"GGUF: the text files hold more than the "
				"%u MiB castfs reads",
				TEXT_BUDGET >> 20);
	if (!rc && r->sh.n)
		rc = ns_gguf_shards_text(ns, &r->sh);
	if (!rc)
		rc = plan_of(r->view, text, len, xt, xt ? x.n : 0,
			     xtmpls_why(&x), r->sh.n ? &r->sh : NULL, ck, plan,
			     &d);
	snprintf(r->reason, sizeof(r->reason), "%s",
		 d.msg[0] ? d.msg :
		 rc	  ? strerror(-rc) :
			    "");
	if (rc && !ns_err_transient(rc))
		ns_logf(ns, r->folder, "view %s: %s", r->view->name, r->reason);
	for (size_t i = 0; i < NTEXTS; i++)
		free(text[i]);
	free(xt);
	xtmpls_fini(&x);
	r->text_bytes = used;
	return rc;
}

/* Give the heap a build of @text_bytes of text freed back to the system
 * (a cJSON tree is many small blocks, which glibc keeps). */
static void trim_after(size_t text_bytes)
{
#ifdef __GLIBC__
	if (text_bytes > GGUF_TRIM_TEXT)
		malloc_trim(0);
#else
	(void)text_bytes;
#endif
}

/* build_plan() once one of the mount's GGUF_BUILDS_MAX slots is free:
 * the daemon's peak is a few builds', however many views are asked for
 * at once. The slot is held until the build's heap is trimmed: freed
 * but still resident, it would add to the next build's peak (a third
 * build's worth while the trim waited for the CPU). */
static int build_gated(struct castfs_ns *ns, struct ns_ckpt *ck,
		       struct gguf_req *r, struct castfs_plan **plan)
{
	int rc;

	pthread_mutex_lock(&ns->gguf_gate_lock);
	while (ns->gguf_builds >= GGUF_BUILDS_MAX)
		pthread_cond_wait(&ns->gguf_gate_free, &ns->gguf_gate_lock);
	ns->gguf_builds++;
	pthread_mutex_unlock(&ns->gguf_gate_lock);
	rc = build_plan(ns, ck, r, plan);
	trim_after(r->text_bytes);
	pthread_mutex_lock(&ns->gguf_gate_lock);
	ns->gguf_builds--;
	pthread_cond_signal(&ns->gguf_gate_free);
	pthread_mutex_unlock(&ns->gguf_gate_lock);
	return rc;
}

/* The entry of (@v, @dep) in @ck and the number of entries; under
 * ck->lock. */
static struct gguf_ent *ent_find(struct ns_ckpt *ck,
				 const struct castfs_view *v, uint64_t dep,
				 size_t *n)
{
	struct gguf_ent *e;

	*n = 0;
	for (e = ck->slot[NS_CKPT_GGUF]; e; e = e->next, (*n)++)
		if (e->view == v && e->dep == dep)
			return e;
	return NULL;
}

/* The entry of @r in @ck (and the number of entries) once no build of it
 * is under way, or NULL; under ck->lock. */
static struct gguf_ent *ent_settled(struct ns_ckpt *ck, struct gguf_req *r,
				    size_t *n)
{
	struct gguf_ent *e;

	while ((e = ent_find(ck, r->view, r->dep, n)) && e->building)
		pthread_cond_wait(&e->built, &ck->lock);
	return e;
}

/* Mark the build of @r under way in its entry @e of @ck, made when NULL
 * (@n entries so far); under ck->lock. Returns the entry, or NULL when
 * the cache is full or memory short: that build is then not shared. */
static struct gguf_ent *ent_claim(struct ns_ckpt *ck, struct gguf_req *r,
				  struct gguf_ent *e, size_t n)
{
	if (!e && n < GGUF_ENTS_MAX && (e = calloc(1, sizeof(*e)))) {
		e->view = r->view;
		e->dep = r->dep;
		pthread_cond_init(&e->built, NULL);
		e->next = ck->slot[NS_CKPT_GGUF];
		ck->slot[NS_CKPT_GGUF] = e;
	}
	if (e)
		e->building = true;
	return e;
}

/*
 * Record the outcome @rc / @plan of @r's build in its entry @e (NULL:
 * none) and wake the requests waiting for it; under ck->lock. A transient
 * error is not kept: a waiter then builds again. The plan is kept, a
 * listing's too: `ls -l` lists the file and then looks it up, which
 * needs the plan (its size), and a build costs the texts' parse. A plan
 * that is not kept goes to r->owned when wanted, else is freed. Returns
 * the bytes kept, for the caller to charge to the cache budget.
 */
static size_t ent_store(struct gguf_ent *e, struct gguf_req *r, int rc,
			struct castfs_plan *plan)
{
	size_t kept = 0;

	if (e && !e->known && !ns_err_transient(rc)) {
		e->known = true;
		e->err = rc;
		memcpy(e->reason, r->reason, sizeof(e->reason));
	}
	if (e && e->known && !e->err && !e->plan && plan) {
		e->plan = plan;
		kept = ns_ckpt_plan_cost(plan);
		plan = NULL;
	}
	if (e && e->known) {
		r->plan = e->plan;
		memcpy(r->reason, e->reason, sizeof(r->reason));
	}
	if (plan && r->want_plan && !r->plan) {
		r->owned = plan;
		r->plan = plan;
		plan = NULL;
	}
	castfs_plan_free(plan);
	if (e) {
		e->building = false;
		pthread_cond_broadcast(&e->built);
	}
	return kept;
}

/*
 * The cached outcome of @r in @ck, built on first need. Returns 0 (with
 * r->plan when r->want_plan), the builder's error (r->reason says why;
 * cached) or a transient errno (not cached). Thread-safe: concurrent
 * requests for one entry share one build, the others waiting for it; a
 * transient failure wakes them, and one of them builds again.
 */
static int gguf_get(struct castfs_ns *ns, struct ns_ckpt *ck,
		    struct gguf_req *r)
{
	struct castfs_plan *plan = NULL;
	struct gguf_ent *e;
	size_t n, kept;
	int rc;

	r->plan = NULL;
	r->owned = NULL;
	r->reason[0] = '\0';
	r->text_bytes = 0;
	pthread_mutex_lock(&ck->lock);
	e = ent_settled(ck, r, &n);
	if (e && e->known && (e->err || e->plan || !r->want_plan)) {
		r->plan = e->plan;
		memcpy(r->reason, e->reason, sizeof(r->reason));
		rc = e->err;
		pthread_mutex_unlock(&ck->lock);
		castfs_stats_count(ns->stats, CASTFS_SCTR_PLAN_CACHE_HITS, 1);
		return rc;
	}
	e = ent_claim(ck, r, e, n);
	pthread_mutex_unlock(&ck->lock);
	rc = build_gated(ns, ck, r, &plan);
	if (!rc)
		castfs_stats_count(ns->stats, CASTFS_SCTR_PLANS_BUILT, 1);
	pthread_mutex_lock(&ck->lock);
	/* This build's own outcome is returned: an entry already known
	 * here said "builds" (its plan given back to the budget, or never
	 * kept), and a failure now is the truth, not -ENOMEM. */
	kept = ent_store(e, r, rc, plan);
	pthread_mutex_unlock(&ck->lock);
	/* Counted like the checkpoint's own plans: past the budget, entries
	 * nothing uses go, and those only nodes hold give their plans back
	 * (a header holds up to 64 MiB of text per view). */
	if (kept)
		ns_ckpt_charge(ns, ck, kept);
	if (!rc && r->want_plan && !r->plan)
		return -ENOMEM;
	return rc;
}

/* Whether node @n is the GGUF file of sharded weights (its path is the
 * index's). */
static bool is_sharded(const struct ns_node *n)
{
	size_t len = strlen(n->path);

	return len >= INDEX_NAME_LEN &&
	       !strcmp(n->path + len - INDEX_NAME_LEN, index_name);
}

/*
 * The permission bits of a file made of index @ist and the shards of @sh:
 * it shows every shard's bytes, so it lets read only whom every one of
 * them lets read (default_permissions). With other owners than the
 * index's, only what the "other" bits grant everybody is kept.
 */
static mode_t shared_perms(const struct stat *ist,
			   const struct ns_gguf_shards *sh)
{
	mode_t perm = ist->st_mode & 07777;
	bool owners = true;

	for (size_t k = 0; k < sh->n; k++) {
		perm &= sh->st[k].st_mode;
		owners = owners && sh->st[k].st_uid == ist->st_uid &&
			 sh->st[k].st_gid == ist->st_gid;
	}
	if (!owners)
		perm = (perm & 07) * 0111;
	return perm;
}

/* @child (its dep the texts') as the GGUF file of the sharded weights of
 * @folder: the index's path and identity, a dep of every shard too. */
static int sharded_node(struct castfs_ns *ns, const char *folder,
			struct ns_node *child)
{
	struct castfs_diag d = { { 0 } };
	struct ns_gguf_shards sh;
	int rc;

	free(child->path);
	child->path = ns_path_join(folder, index_name, INDEX_NAME_LEN);
	if (!child->path)
		return -ENOMEM;
	rc = ns_src_stat_in(ns, child->path, &child->st);
	if (!rc && !S_ISREG(child->st.st_mode))
		rc = -ENOENT;
	if (!rc)
		rc = ns_gguf_shards_read(ns, folder, child->path, &child->st,
					 &sh, &d);
	if (rc)
		return rc;
	child->dep = ns_gguf_shards_dep(&sh, child->dep);
	child->st.st_mode = (child->st.st_mode & S_IFMT) |
			    shared_perms(&child->st, &sh);
	/* What links' paths cut from any of them tells this node apart
	 * (ns_src_link_hide()). */
	for (size_t k = 0; k < sh.n; k++)
		child->st.st_rdev |= sh.st[k].st_rdev;
	ns_gguf_shards_fini(ns, &sh);
	return 0;
}

static int mdgguf_lookup(struct castfs_ns *ns, const struct ns_node *dir,
			 const char *name, struct ns_node *child)
{
	size_t dlen;
	const struct castfs_view *v =
		ns_split_gguf_name(ns, name, strlen(name), &dlen);
	struct stat tst[NTEXTS];
	char *folder;
	struct stat st;
	int rc;

	if (!v)
		return -ENOENT;
	folder = ns_path_join(dir->path, name, dlen);
	if (!folder)
		return -ENOMEM;
	rc = ns_src_stat(ns, folder, &st);
	if (!rc && !S_ISDIR(st.st_mode))
		rc = -ENOENT;
	if (!rc)
		rc = texts_dep(ns, folder, &child->dep, tst, NULL);
	if (!rc) {
		child->path = ns_path_join(folder, "model.safetensors", 17);
		rc = child->path ? ns_src_stat_in(ns, child->path, &child->st) :
				   -ENOMEM;
		/* no single file: the shards (not when a text is missing: a
		 * node that could never build answered ESTALE; bug hunt) */
		if (rc == -ENOENT)
			rc = sharded_node(ns, folder, child);
	}
	if (!rc && !S_ISREG(child->st.st_mode))
		rc = -ENOENT;
	/* The GGUF lies beside the folder: nobody searches the folder to
	 * read it (a review: a 0700 folder's weights for everyone). */
	if (!rc)
		ns_src_dir_hide(&child->st, &st);
	free(folder);
	if (rc) {
		free(child->path);
		child->path = NULL;
		return rc == -ENOMEM ? rc : -ENOENT;
	}
	child->kind = NS_MGGUF;
	child->view = v;
	return 0;
}

/* The first shard's checkpoint entry of r->sh, held once more into *@ck
 * (where the outcomes are cached), after holding every shard. */
static int hold_shards(struct castfs_ns *ns, struct gguf_req *r,
		       struct ns_ckpt **ck)
{
	int rc = ns_gguf_shards_hold(ns, &r->sh);

	if (rc)
		return rc;
	*ck = r->sh.ck[0];
	atomic_fetch_add(&(*ck)->refs, 1);
	return 0;
}

/* The weights of node @n, held in *@ck (and r->sh when sharded), if they
 * are the identities its lookup saw (else -ESTALE); r->dep is then set. */
static int hold_weights(struct castfs_ns *ns, const struct ns_node *n,
			const char *folder, struct ns_ckpt **ck,
			struct gguf_req *r)
{
	struct castfs_diag d = { { 0 } };
	struct stat st;
	int rc = texts_dep(ns, folder, &r->dep, r->st, &r->xdep);

	if (!rc && is_sharded(n)) {
		rc = ns_gguf_shards_read(ns, folder, n->path, &n->st, &r->sh,
					 &d);
		if (!rc)
			r->dep = ns_gguf_shards_dep(&r->sh, r->dep);
		if (!rc && r->dep == n->dep)
			rc = hold_shards(ns, r, ck);
		else if (!rc)
			rc = -ESTALE;
		if (rc)
			ns_gguf_shards_fini(ns, &r->sh);
		return rc;
	}
	if (!rc && r->dep != n->dep)
		rc = -ESTALE;
	if (!rc)
		rc = ns_ckpt_valid(ns, n->path, &st, ck);
	if (!rc && !ns_same_file(&st, &n->st)) {
		ns_ckpt_put(ns, *ck);
		rc = -ESTALE;
	}
	return rc;
}

/*
 * The checkpoint (held, in *@ck; the shards in r->sh) and the outcome of
 * node @n, if nothing it is made of moved since its lookup (else
 * -ESTALE). A folder that does not map is -ENOENT: it is not listed, so
 * its lookup finds nothing, like any name not listed (the reason is in
 * the log and /.castfs/refused). On success the caller frees r->owned,
 * puts *@ck and finis r->sh.
 */
static int mdgguf_plan(struct castfs_ns *ns, const struct ns_node *n,
		       struct ns_ckpt **ck, struct gguf_req *r)
{
	char *folder = ns_parent_path(n->path);
	int rc = folder ? hold_weights(ns, n, folder, ck, r) : -ENOMEM;

	if (rc) {
		free(folder);
		return rc == -ENOMEM ? rc : -ESTALE;
	}
	r->folder = folder;
	r->view = n->view;
	if (!rc)
		rc = gguf_get(ns, *ck, r);
	free(folder);
	r->folder = NULL;
	if (rc) {
		ns_ckpt_put(ns, *ck);
		ns_gguf_shards_fini(ns, &r->sh);
	}
	return ns_err_unlisted(rc);
}

/* Whether the folder of node @n maps (its plan builds): listings show
 * only files that open. Only for views chosen with -o views=. */
static bool maps(struct castfs_ns *ns, const struct ns_node *n)
{
	struct gguf_req r = { .want_plan = false };
	struct ns_ckpt *ck;

	if (mdgguf_plan(ns, n, &ck, &r))
		return false;
	castfs_plan_free(r.owned);
	ns_ckpt_put(ns, ck);
	ns_gguf_shards_fini(ns, &r.sh);
	return true;
}

/* List DIR.<q>.gguf for the listed GGUF views of a model folder. */
static int mdgguf_list(struct castfs_ns *ns, const struct ns_node *dir,
		       const char *name, mode_t type, bool ckpt,
		       const struct stat *st, struct ns_list *l)
{
	char buf[300];

	(void)ckpt;
	(void)st;
	if (type != S_IFDIR)
		return 0;
	for (size_t i = 0; i < ns->views->n; i++) {
		const struct castfs_view *v = &ns->views->v[i];
		struct ns_node n = { 0 };
		int k, rc;

		if (!v->listed || v->kind != CASTFS_VIEW_GGUF)
			continue;
		k = snprintf(buf, sizeof(buf), "%s.%s", name, v->name);
		/* Past NAME_MAX it cannot be: what it would be is asked
		 * only for /.castfs/refused. */
		if (k < 0 || (size_t)k >= sizeof(buf) ||
		    (k > NAME_MAX && !l->too_long) ||
		    (k <= NAME_MAX && ns_list_has(l, buf, (size_t)k)))
			continue;
		rc = mdgguf_lookup(ns, dir, buf, &n);
		if (rc == -ENOMEM)
			return rc;
		if (rc)
			return 0; /* not a model folder */
		n.id = ns_node_id(&n);
		if (!maps(ns, &n))
			rc = 0;
		else
			rc = ns_list_derived(l, dir->path, name, v->name, buf,
					     (size_t)k, S_IFREG, n.id);
		free(n.path);
		if (rc)
			return rc;
	}
	return 0;
}

/* ---- /.castfs/refused ---- */

/* Whether @folder holds a regular @name. */
static bool has_file(struct castfs_ns *ns, const char *folder, const char *name)
{
	char *p = ns_path_join(folder, name, strlen(name));
	struct stat st;
	bool yes = p && !ns_src_stat_in(ns, p, &st) && S_ISREG(st.st_mode);

	free(p);
	return yes;
}

/* Why the weights of @folder, held in *@ck (and r->sh), have no
 * DIR.<q>.gguf before its JSON is read, or NULL when they are candidates. */
static const char *texts_refusal(struct castfs_ns *ns, const char *folder,
				 struct gguf_req *r, struct ns_ckpt **ck)
{
	int rc = texts_dep(ns, folder, &r->dep, r->st, &r->xdep);

	if (!rc && r->sh.n)
		r->dep = ns_gguf_shards_dep(&r->sh, r->dep);
	if (rc == -ENOENT) {
		ns_ckpt_put(ns, *ck);
		return has_file(ns, folder, "tokenizer.model") ?
			       "GGUF: a SentencePiece tokenizer.model without "
			       "tokenizer.json is not mapped" :
			       "GGUF: no tokenizer.json (the tokenizer castfs "
			       "maps)";
	}
	if (rc) {
		ns_ckpt_put(ns, *ck);
		return "";
	}
	return NULL;
}

/* folder_refusal() of sharded weights: the index's reason in @buf. */
static const char *shards_refusal(struct castfs_ns *ns, const char *folder,
				  struct gguf_req *r, struct ns_ckpt **ck,
				  char buf[256])
{
	struct castfs_diag d = { { 0 } };
	char *ix = ns_path_join(folder, index_name, INDEX_NAME_LEN);
	struct stat ist;
	int rc = ix ? ns_src_stat_in(ns, ix, &ist) : -ENOMEM;

	if (!rc)
		rc = ns_gguf_shards_read(ns, folder, ix, &ist, &r->sh, &d);
	free(ix);
	if (rc && d.msg[0]) {
		snprintf(buf, 256, "%s", d.msg);
		return buf;
	}
	if (!rc)
		rc = hold_shards(ns, r, ck);
	if (rc) /* a rejected shard is listed in /.castfs/rejected */
		return "";
	return texts_refusal(ns, folder, r, ck);
}

/* Why @folder (with a config.json) has no DIR.<q>.gguf before its JSON is
 * read, or NULL when it is a candidate whose weights are in *@ck (and
 * r->sh, when sharded). */
static const char *folder_refusal(struct castfs_ns *ns, const char *folder,
				  struct gguf_req *r, struct ns_ckpt **ck,
				  char buf[256])
{
	char *w = ns_path_join(folder, "model.safetensors", 17);
	struct stat st;
	int rc = w ? ns_ckpt_valid(ns, w, &st, ck) : -ENOMEM;

	free(w);
	if (rc == -ENOENT && has_file(ns, folder, index_name))
		return shards_refusal(ns, folder, r, ck, buf);
	if (rc) /* rejected weights are listed in /.castfs/rejected */
		return "";
	return texts_refusal(ns, folder, r, ck);
}

static int mdgguf_refusals(struct castfs_ns *ns, const char *path, cJSON *arr)
{
	struct gguf_req r = { .folder = path };
	struct ns_ckpt *ck = NULL;
	char buf[256];
	const char *why;
	int rc = 0;

	if (!path[0] || !has_file(ns, path, "config.json"))
		return 0;
	why = folder_refusal(ns, path, &r, &ck, buf);
	for (size_t i = 0; !rc && i < ns->views->n; i++) {
		const struct castfs_view *v = &ns->views->v[i];

		if (v->kind != CASTFS_VIEW_GGUF || (why && !why[0]))
			continue;
		if (why) {
			rc = ns_refusal_add(arr, path, v->name, why);
			continue;
		}
		r.view = v;
		rc = gguf_get(ns, ck, &r);
		castfs_plan_free(r.owned);
		if (rc && !ns_err_transient(rc))
			rc = ns_refusal_add(arr, path, v->name, r.reason);
		else if (rc != -ENOMEM)
			rc = 0;
	}
	if (!why)
		ns_ckpt_put(ns, ck);
	ns_gguf_shards_fini(ns, &r.sh);
	return rc;
}

const struct ns_dir_ext ns_mdgguf_dir_ext = {
	.lookup = mdgguf_lookup,
	.list = mdgguf_list,
	.refusals = mdgguf_refusals,
};

/* ---- the file ---- */

static int mdgguf_getattr(struct castfs_ns *ns, const struct ns_node *n,
			  struct stat *st)
{
	struct gguf_req r = { .want_plan = true };
	struct ns_ckpt *ck;
	int rc = mdgguf_plan(ns, n, &ck, &r);

	if (rc)
		return rc;
	ns_view_stat(&n->st, r.plan->size, n->id, st);
	castfs_plan_free(r.owned);
	ns_ckpt_put(ns, ck);
	ns_gguf_shards_fini(ns, &r.sh);
	return 0;
}

static int mdgguf_open(struct castfs_ns *ns, const struct ns_node *n,
		       struct castfs_file **out)
{
	struct gguf_req r = { .want_plan = true };
	struct ns_ckpt *ck;
	int rc = mdgguf_plan(ns, n, &ck, &r);

	if (rc)
		return rc;
	/* the file owns a plan the cache does not keep, on failure too */
	if (r.sh.n)
		rc = ns_file_new_parts(ns, r.sh.n, r.sh.paths, r.sh.st, r.sh.ck,
				       r.plan, r.owned,
				       ns_view_index(ns, n->view), out);
	else
		rc = ns_file_new_plan(ns, n->path, &n->st, ck, r.plan, r.owned,
				      ns_view_index(ns, n->view), out);
	ns_ckpt_put(ns, ck);
	ns_gguf_shards_fini(ns, &r.sh);
	return rc;
}

const struct ns_kind_ops ns_kind_mgguf = {
	.getattr = mdgguf_getattr,
	.open = mdgguf_open,
	.getxattr = ns_view_getxattr,
	.listxattr = ns_view_listxattr,
};
