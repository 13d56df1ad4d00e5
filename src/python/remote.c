/* remote.c: what python/datahelix reads at URLs through the C remote reader (docs/remote.md):
 * remote_read(url) -> bytes, a small object read whole (a manifest, a profile set at an
 * http://, https:// or s3:// URL), with the process's S3 settings and TLS trust, the same as
 * the DataServers' reads; errors raise the C code's class (NotFoundError for a 404, ...)
 * with the message naming the URL, the HTTP status and S3's code; remote_reload_settings():
 * the remote reader's settings taken from the environment as it is now (DH_CA_BUNDLE,
 * DH_HTTP_*; the AWS variables and files at the next s3:// request), which every DataLoader
 * does when it is made, so that it and the DataServers it starts in this process read with
 * the settings of its time. */
#include "binding.h"

#include "datahelix/alloc.h"
#include "remote/remote_lib.h"

/* The largest object read whole from Python. */
#define REMOTE_READ_MAX_BYTES ((size_t)4 << 30)

PyObject *dh__py_remote_read(PyObject *m, PyObject *args)
{
    const char *url;
    if (!PyArg_ParseTuple(args, "s", &url))
        return NULL;
    char *data = NULL;
    size_t len = 0;
    int rc;
    Py_BEGIN_ALLOW_THREADS rc = dh__remote_read_whole(url, REMOTE_READ_MAX_BYTES, &data, &len);
    Py_END_ALLOW_THREADS if (rc < 0) return dh__py_raise_dh(rc, NULL);
    PyObject *out = PyBytes_FromStringAndSize(data, (Py_ssize_t)len);
    dh_free(data);
    return out;
}

PyObject *dh__py_remote_reload_settings(PyObject *m, PyObject *unused)
{
    int rc;
    Py_BEGIN_ALLOW_THREADS dh__http_config_t cfg;
    dh__http_config_defaults(&cfg);
    rc = dh__http_configure(&cfg);
    if (rc == 0)
        dh__remote_s3_forget();
    Py_END_ALLOW_THREADS if (rc < 0) return dh__py_raise_dh(rc, NULL);
    Py_RETURN_NONE;
}
