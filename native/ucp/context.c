/*
 * context.c — configuration and the context (a process's use of ucxpy).
 *
 * Entry points: ucp_config_read, ucp_config_release, ucp_init_version,
 * ucp_cleanup, ucp_get_version, ucp_get_version_string, ucp_context_query,
 * ucp_context_print_info, ucp_lib_query.
 *
 * Theory of operation.  Configuration is ucxpy's own (UCXPY_* variables, read
 * by the core when the context is made); UCX's names (UCX_* of the
 * environment, UCX_<prefix>_*, and what ucp_config_modify recorded in the
 * caller's ucp_config_t) are mapped to them where they have a meaning here
 * (ucxpy/tools/ucxvars.py), and the others reported once as ignored.  ucp_init_version
 * attaches to Python (attach.c) and makes the core's Context.  Of the
 * caller's ucp_params_t only the fields its field_mask names are read, so
 * callers built against any API from 1.13 to 1.23 pass their own struct.
 * ucp_context_print_info prints ucxpy's own transports and devices (capi.py
 * context_info), in the `# resource` line layout of UCX's, never UCX's names.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "shim.h"

ucs_status_t ucp_config_read(const char *env_prefix, const char *filename,
                             ucp_config_t **config_p)
{
    (void)filename;                         /* (UCX's config files: not read) */
    ucp_config_t *c = calloc(1, sizeof(*c));
    if (c == NULL)
        return UCS_ERR_NO_MEMORY;
    c->prefix = strdup(env_prefix != NULL ? env_prefix : "");
    c->modified = calloc(1, 1);
    if (c->prefix == NULL || c->modified == NULL) {
        ucp_config_release(c);
        return UCS_ERR_NO_MEMORY;
    }
    *config_p = c;
    return UCS_OK;
}

void ucp_config_release(ucp_config_t *config)
{
    if (config == NULL)
        return;
    free(config->prefix);
    free(config->modified);
    free(config);
}

/* Recorded; ucp_init maps it as it maps the environment's UCX_<name>
 * (ucxpy/tools/ucxvars.py: a name with no ucxpy meaning is reported once). */
ucs_status_t ucp_config_modify(ucp_config_t *config, const char *name, const char *value)
{
    if (config == NULL || name == NULL || value == NULL || strchr(name, '=') != NULL ||
            strchr(name, '\n') != NULL || strchr(value, '\n') != NULL)
        return UCS_ERR_INVALID_PARAM;
    size_t add = strlen(name) + strlen(value) + 2;
    char *m = realloc(config->modified, config->length + add + 1);
    if (m == NULL)
        return UCS_ERR_NO_MEMORY;
    snprintf(m + config->length, add + 1, "%s=%s\n", name, value);
    config->modified = m;
    config->length += add;
    return UCS_OK;
}

void ucp_get_version(unsigned *major_version, unsigned *minor_version,
                     unsigned *release_number)
{
    *major_version = UCXS_API_MAJOR;
    *minor_version = UCXS_API_MINOR;
    *release_number = 0;
}

const char *ucp_get_version_string(void)
{
    return "1.20.0 (ucxpy)";
}

ucs_status_t ucp_init_version(unsigned api_major_version, unsigned api_minor_version,
                              const ucp_params_t *params, const ucp_config_t *config,
                              ucp_context_h *context_p)
{
    ucs_status_t status;
    ucp_context_h ctx;

    if (api_major_version != UCXS_API_MAJOR || api_minor_version > UCXS_API_MINOR_ACCEPTED) {
        ucxs_error("ucp_init", "the caller wants UCP API %u.%u, this library has %u.%u "
                   "(and takes callers of up to %u.%u)", api_major_version, api_minor_version,
                   UCXS_API_MAJOR, UCXS_API_MINOR, UCXS_API_MAJOR, UCXS_API_MINOR_ACCEPTED);
        return UCS_ERR_UNSUPPORTED;
    }
    status = ucxs_attach();
    if (status != UCS_OK)
        return status;
    ctx = calloc(1, sizeof(*ctx));
    if (ctx == NULL)
        return UCS_ERR_NO_MEMORY;
    pthread_mutex_init(&ctx->pool_lock, NULL);
    if (params->field_mask & UCP_PARAM_FIELD_FEATURES)
        ctx->features = params->features;
    if (params->field_mask & UCP_PARAM_FIELD_REQUEST_SIZE)
        ctx->user_size = params->request_size;
    if (params->field_mask & UCP_PARAM_FIELD_REQUEST_INIT)
        ctx->init = params->request_init;
    if (params->field_mask & UCP_PARAM_FIELD_REQUEST_CLEANUP)
        ctx->cleanup = params->request_cleanup;
    status = ucxs_py->context_create(config != NULL ? config->prefix : "",
                                     config != NULL ? config->modified : "", &ctx->py);
    if (status != UCS_OK) {
        pthread_mutex_destroy(&ctx->pool_lock);
        free(ctx);
        return status;
    }
    *context_p = ctx;
    return UCS_OK;
}

void ucp_cleanup(ucp_context_h ctx)
{
    ucxs_pool_destroy(ctx);
    ucxs_py->release(ctx->py);
    pthread_mutex_destroy(&ctx->pool_lock);
    free(ctx);
}

ucs_status_t ucp_context_query(ucp_context_h ctx, ucp_context_attr_t *attr)
{
    if (attr->field_mask & UCP_ATTR_FIELD_REQUEST_SIZE)
        attr->request_size = UCXS_REQ_HEADER;  /* room before a caller-allocated request */
    if (attr->field_mask & UCP_ATTR_FIELD_THREAD_MODE)
        attr->thread_mode = UCS_THREAD_MODE_MULTI;
    if (attr->field_mask & UCP_ATTR_FIELD_MEMORY_TYPES)
        attr->memory_types = UCS_BIT(UCS_MEMORY_TYPE_HOST);
    return UCS_OK;
}

/* The library's thread level: every entry point may be called from any
 * thread at any time (each context and worker reports UCS_THREAD_MODE_MULTI
 * too); NIXL asks before it runs a progress thread beside its callers. */
ucs_status_t ucp_lib_query(ucp_lib_attr_t *attr)
{
    if (attr == NULL)
        return UCS_ERR_INVALID_PARAM;
    if (attr->field_mask & UCP_LIB_ATTR_FIELD_MAX_THREAD_LEVEL)
        attr->max_thread_level = UCS_THREAD_MODE_MULTI;
    return UCS_OK;
}

void ucp_context_print_info(const ucp_context_h context, FILE *stream)
{
    char *text = NULL;
    if (ucxs_py->context_info(context->py, &text) != UCS_OK)
        fprintf(stream, "# UCP context: ucxpy (its description failed: see stderr)\n");
    else
        fputs(text, stream);
    free(text);
}
