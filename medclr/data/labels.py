"""Label vocabularies shared by readers, training and evaluation."""

# The 14 CheXpert observations, in the column order of mimic-cxr-2.0.0-chexpert.csv.gz.
CHEXPERT_LABELS: tuple[str, ...] = (
    "Atelectasis",
    "Cardiomegaly",
    "Consolidation",
    "Edema",
    "Enlarged Cardiomediastinum",
    "Fracture",
    "Lung Lesion",
    "Lung Opacity",
    "No Finding",
    "Pleural Effusion",
    "Pleural Other",
    "Pneumonia",
    "Pneumothorax",
    "Support Devices",
)

# The zero-shot set of the sample-specific debiasing paper (not CheXpert-5).
CHEX5: tuple[str, ...] = ("Cardiomegaly", "Edema", "Pleural Effusion", "Pneumonia", "Pneumothorax")

# MS-CXR's 8 grounding categories (category_name column).
MSCXR_CATEGORIES: tuple[str, ...] = (
    "Atelectasis",
    "Cardiomegaly",
    "Consolidation",
    "Edema",
    "Lung Opacity",
    "Pleural Effusion",
    "Pneumonia",
    "Pneumothorax",
)
