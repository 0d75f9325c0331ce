/*
 * attach.c — finding Python, and the bridge, from a library that links neither.
 *
 * Theory of operation.  ucp_init calls ucxs_attach once per process:
 *  1. Look up the running interpreter by its exported C API
 *     (dlsym(RTLD_DEFAULT, "Py_IsInitialized")): present in a Python process,
 *     whether the interpreter is static and exports its API (Debian's
 *     /usr/bin/python3.11) or links libpython (a venv's).  Such a process
 *     keeps its interpreter: a second one would be a second runtime.
 *  2. In a process with no interpreter (a C MPI program) open the libpython
 *     this library was built against, RTLD_GLOBAL so the bridge extension
 *     resolves against it, give it the build's Python home (UCXS_PYHOME: else
 *     it would look for its standard library by the first `python3` on PATH,
 *     and Open MPI's ranks find Debian's there, whose stdlib is not this
 *     libpython's), start it without signal handlers, add the build's
 *     site-packages (UCXS_SITE, or $UCXPY_PYTHONPATH) by site.addsitedir so
 *     the project's editable install is found, and release the GIL.
 *  3. Import ucxpy._ucp_bridge and take its table from a capsule; give it
 *     libucp's completion entry points.
 * Only the handful of Python calls needed for that go through dlsym here;
 * everything else is the bridge's.
 */
#include <dlfcn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <wchar.h>

#include "shim.h"

#ifndef UCXS_LIBPYTHON
#define UCXS_LIBPYTHON "libpython3.so"
#endif
#ifndef UCXS_SITE
#define UCXS_SITE ""
#endif
#ifndef UCXS_PYHOME
#define UCXS_PYHOME ""
#endif

const ucxs_bridge_t *ucxs_py;
int ucxs_python_host;

static const ucxs_core_t core = {
    .complete = ucxs_core_complete,
    .am_arrived = ucxs_core_am_arrived,
    .ext_recv = ucxs_core_ext_recv,
};

static void say(const char *entry, const char *fmt, va_list ap, const char *tail)
{
    fprintf(stderr, "ucxpy libucp: %s: ", entry);
    vfprintf(stderr, fmt, ap);
    fputs(tail, stderr);
}

void ucxs_error(const char *entry, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    say(entry, fmt, ap, "\n");
    va_end(ap);
}

void ucxs_fatal(const char *entry, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    say(entry, fmt, ap, " (aborting)\n");
    va_end(ap);
    abort();
}

typedef struct {
    int (*is_initialized)(void);
    void (*initialize_ex)(int);
    void *(*save_thread)(void);
    int (*gil_ensure)(void);
    void (*gil_release)(int);
    void *(*capsule_import)(const char *, int);
    void *(*import_module)(const char *);
    void (*decref)(void *);
    int (*run_string)(const char *);
    void (*print_error)(void);
} ucxs_pyapi_t;

static int pyapi_lookup(void *lib, ucxs_pyapi_t *api)
{
    void **slots[] = {(void **)&api->is_initialized, (void **)&api->initialize_ex,
                      (void **)&api->save_thread, (void **)&api->gil_ensure,
                      (void **)&api->gil_release, (void **)&api->capsule_import,
                      (void **)&api->run_string, (void **)&api->print_error,
                      (void **)&api->import_module, (void **)&api->decref};
    static const char *names[] = {"Py_IsInitialized", "Py_InitializeEx", "PyEval_SaveThread",
                                  "PyGILState_Ensure", "PyGILState_Release",
                                  "PyCapsule_Import", "PyRun_SimpleString", "PyErr_Print",
                                  "PyImport_ImportModule", "Py_DecRef"};
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        *slots[i] = dlsym(lib, names[i]);
        if (*slots[i] == NULL)
            return 0;
    }
    return 1;
}

/* Start an interpreter in a process that has none; returns 0 on failure. */
static int start_python(ucxs_pyapi_t *api)
{
    void *lib = dlopen(UCXS_LIBPYTHON, RTLD_NOW | RTLD_GLOBAL);
    if (lib == NULL) {
        ucxs_error("ucp_init", "no Python in this process and cannot load %s: %s",
                   UCXS_LIBPYTHON, dlerror());
        return 0;
    }
    if (!pyapi_lookup(lib, api)) {
        ucxs_error("ucp_init", "%s lacks the Python C API", UCXS_LIBPYTHON);
        return 0;
    }
    /* the home of the libpython opened (sys.base_prefix at build time) */
    void (*set_home)(const wchar_t *) = (void (*)(const wchar_t *))dlsym(lib, "Py_SetPythonHome");
    wchar_t *(*decode)(const char *, size_t *) =
        (wchar_t *(*)(const char *, size_t *))dlsym(lib, "Py_DecodeLocale");
    if (UCXS_PYHOME[0] != '\0' && set_home != NULL && decode != NULL) {
        static wchar_t *home;              /* Python keeps the pointer: never freed */
        if ((home = decode(UCXS_PYHOME, NULL)) != NULL)
            set_home(home);
    }
    api->initialize_ex(0);
    /* the build's site-packages first, then $UCXPY_PYTHONPATH: .pth files and
     * the editable install's finder are processed as at interpreter start */
    int rc = api->run_string("import os, site\n"
                             "for p in ('" UCXS_SITE ":' + os.environ.get('UCXPY_PYTHONPATH', '')"
                             ").split(':'):\n"
                             "    p and site.addsitedir(p)\n");
    api->save_thread();                    /* every later entry takes the GIL itself */
    return rc == 0;
}

ucs_status_t ucxs_attach(void)
{
    static pthread_mutex_t once = PTHREAD_MUTEX_INITIALIZER;
    ucs_status_t status = UCS_OK;
    ucxs_pyapi_t api;

    pthread_mutex_lock(&once);
    if (ucxs_py != NULL)
        goto out;
    status = UCS_ERR_NO_RESOURCE;
    if (!pyapi_lookup(RTLD_DEFAULT, &api) || !api.is_initialized()) {
        if (!start_python(&api))
            goto out;
    } else {
        ucxs_python_host = 1;               /* (worker.c: its C threads never wait for the GIL) */
    }
    int gil = api.gil_ensure();
    void *module = api.import_module("ucxpy._ucp_bridge");   /* the capsule's module */
    const ucxs_bridge_t *table = module != NULL ? api.capsule_import(UCXS_BRIDGE_CAPSULE, 0)
                                                : NULL;
    if (module != NULL)
        api.decref(module);
    if (table == NULL) {
        api.print_error();
        ucxs_error("ucp_init", "cannot import the bridge %s (is ucxpy installed for this "
                   "Python?)", UCXS_BRIDGE_CAPSULE);
    } else if (table->abi != UCXS_BRIDGE_ABI) {
        ucxs_error("ucp_init", "bridge ABI %d, this library needs %d", table->abi,
                   UCXS_BRIDGE_ABI);
    } else {
        table->attach(&core);
        ucxs_py = table;
        status = UCS_OK;
    }
    api.gil_release(gil);
out:
    pthread_mutex_unlock(&once);
    return status;
}
