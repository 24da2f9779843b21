package posenc;

/** The dtypes of the service, with their safetensors and KServe v2 names and element sizes. */
public enum DType {
    FLOAT64("float64", "F64", "FP64", 8),
    FLOAT32("float32", "F32", "FP32", 4),
    FLOAT16("float16", "F16", "FP16", 2),
    BFLOAT16("bfloat16", "BF16", "BF16", 2),
    INT64("int64", "I64", "INT64", 8),
    INT32("int32", "I32", "INT32", 4),
    INT16("int16", "I16", "INT16", 2),
    INT8("int8", "I8", "INT8", 1),
    UINT64("uint64", "U64", "UINT64", 8),
    UINT32("uint32", "U32", "UINT32", 4),
    UINT16("uint16", "U16", "UINT16", 2),
    UINT8("uint8", "U8", "UINT8", 1),
    BOOL("bool", "BOOL", "BOOL", 1);

    public final String serviceName;
    public final String safetensors;
    public final String kserve;
    public final int size;

    DType(String serviceName, String safetensors, String kserve, int size) {
        this.serviceName = serviceName;
        this.safetensors = safetensors;
        this.kserve = kserve;
        this.size = size;
    }

    /** By the service's name ("float32"), the safetensors code ("F32") or the KServe name ("FP32"). */
    public static DType of(String name) {
        for (DType d : values()) {
            if (d.serviceName.equals(name) || d.safetensors.equals(name) || d.kserve.equals(name)) {
                return d;
            }
        }
        throw new IllegalArgumentException("unsupported dtype " + name);
    }
}
